"""Child process for tcc on its PostgreSQL store: the crash run of ``benchmarks/agent/agent.py``,
or its in-process recovery in a fresh process.

Usage: python pg_child_tcc.py '<json args>' with keys mode (crash | recover), n, regime,
work_iters (agent.py's arguments), url (postgresql:// URL of an initialised store),
key_file, out (result JSON).

- crash: open the store, start run ``bench`` of ``benchmarks/agent/agent.py`` with the
  continuation strategy (what ``tcc run --run-id bench AGENT N REGIME ITERS`` does, through
  the same ``tcc.runtime.start``) and, at the START of step n-1's effect body (its intent is
  journaled, its completion is not, as with ``BENCH_KILL_AT``), write {"t_begin", "t_kill"}
  and SIGKILL itself.  (t_kill - t_begin) / (n - 1) is the per-step cost, measured exactly as
  the peers' children measure theirs: from just after the store is open to the start of
  step n-1.
- recover: ``tcc.runtime.resume`` (what ``tcc resume bench`` does after its imports); at the
  start of the first new step (n-1) write {"t_new_step"} and ``os._exit(0)``.  In-process
  recovery is ``t_new_step - t0``, t0 just before the store is opened, with tcc, psycopg
  and the agent imported before it: the peers' children take their t0 at the same point.
"""

import time

T_PROC = time.time()  # first statement: interpreter start-up is before, imports after

import inspect  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import pathlib  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402

import psycopg  # noqa: E402,F401  (the driver, imported before t0 as the peers import theirs)
import psycopg_pool  # noqa: E402,F401
from tcc import runtime  # noqa: E402
from tcc.store import open_store  # noqa: E402

import _agent  # noqa: E402  (a sibling: the agent's shared messages)

T_IMPORTED = time.time()

AGENT = str(pathlib.Path(__file__).resolve().parent.parent / "agent" / "agent.py")
ARGS = json.loads(sys.argv[1])
N: int = ARGS["n"]
_marks: dict[str, float] = {"t_proc": T_PROC, "t_imported": T_IMPORTED}


def _write_out(extra: dict) -> None:
    tmp = ARGS["out"] + ".tmp"
    with open(tmp, "w") as f:
        json.dump({**_marks, **extra}, f)
    os.replace(tmp, ARGS["out"])


def _hook(i: int) -> None:
    if i == N - 1:
        if ARGS.get("mode", "crash") == "recover":
            _write_out({"t_new_step": time.time()})
            os._exit(0)
        _write_out({"t_kill": time.time()})
        os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    os.environ["TCC_STORE"] = ARGS["url"]
    os.environ["TCC_STORE_KEY_FILE"] = ARGS["key_file"]
    kwargs = {"key_file": ARGS["key_file"]} if "key_file" in inspect.signature(open_store).parameters else {}
    agent = runtime.load_script(AGENT)
    agent.Harness.in_process_hook[:] = [_hook]
    _marks["t_imported"] = time.time()
    _marks["t0"] = time.time()
    if ARGS.get("mode", "crash") == "recover":
        with open_store(ARGS["url"], create=False, **kwargs) as store:
            _marks["t_opened"] = time.time()
            outcome = runtime.resume(store, "bench")
        raise SystemExit(f"the recovery never reached step {N - 1}: {outcome}")
    with open_store(ARGS["url"], **kwargs) as store:
        _agent.warm()  # the messages' text, read before timing (as an agent holds its prompts)
        _marks["t_begin"] = time.time()
        outcome = runtime.start(store, AGENT, [str(N), ARGS["regime"], str(ARGS["work_iters"])],
                                run_id="bench", strategy="continuation")
    raise SystemExit(f"crash run finished without the kill: {outcome}")


if __name__ == "__main__":
    main()
