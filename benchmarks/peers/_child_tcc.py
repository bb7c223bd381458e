"""Child process for tcc as a peer: one run of ``benchmarks/agent/agent.py`` on the LMDB store,
measured by the same driver (``_harness.run_peer``) and at the same points as DBOS and
LangGraph, so that no system is timed in a warmer process than another.

Usage: python _child_tcc.py '<json args>' with keys mode (crash | recover | complete), n,
regime, iters, store (store folder), effects (effect log path), out (result JSON path).

Interpreter start-up is before ``T_PROC`` and imports (tcc, and the agent's script, as the
peers import their agent's code) before ``T_IMPORTED``; ``t0`` is taken just before the store
is opened, as the peers take it just before their database is opened.

- crash: start run ``bench`` (continuation strategy, what ``tcc run --run-id bench`` does);
  at the START of step n-1's effect body write {"t_begin", "t_kill"} and SIGKILL this
  process: steps 0..n-2 are durable, step n-1's intent is journaled, its completion is not.
- recover: ``tcc.runtime.resume`` (what ``tcc resume bench`` does after its imports); at the
  start of the first new step (n-1) write the timestamps and ``os._exit(0)`` at once.
- complete: resume and let the run finish; write its result.

Every executed step appends its number to the effect log (after the hook), so duplicates
show as extra lines.
"""

import time

T_PROC = time.time()  # first statement: interpreter start-up is before, imports after

import json  # noqa: E402
import os  # noqa: E402
import pathlib  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402

from tcc import runtime  # noqa: E402
from tcc.store import open_store  # noqa: E402

import _agent  # noqa: E402  (a sibling: the agent's shared messages)

AGENT = str(pathlib.Path(__file__).resolve().parent.parent / "agent" / "agent.py")
agent = runtime.load_script(AGENT)

T_IMPORTED = time.time()

ARGS = json.loads(sys.argv[1])
MODE: str = ARGS["mode"]
N: int = ARGS["n"]
MARKS = frozenset(ARGS.get("marks", ()))  # crash: prefix sizes timed on the way (_harness.step_run)
_marks: dict[str, float] = {"t_proc": T_PROC, "t_imported": T_IMPORTED}
_fd = os.open(ARGS["effects"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)


def _write_out(extra: dict) -> None:
    tmp = ARGS["out"] + ".tmp"
    with open(tmp, "w") as f:
        json.dump({**_marks, **extra}, f)
    os.replace(tmp, ARGS["out"])


def _hook(i: int) -> None:
    _agent.note_mark(i, MARKS, _marks, _fd)
    if i == N - 1:
        now = time.time()
        if MODE == "crash":
            _write_out({"t_kill": now})
            os.kill(os.getpid(), signal.SIGKILL)
        elif MODE == "recover":
            _write_out({"t_new_step": now})
            os._exit(0)
    os.write(_fd, b"%d\n" % i)  # the step's side effect (counts executions)


def main() -> None:
    agent.Harness.in_process_hook[:] = [_hook]
    _marks["t0"] = time.time()
    with open_store(ARGS["store"], create=MODE == "crash") as store:
        _marks["t_opened"] = time.time()
        if MODE == "crash":
            _agent.warm()  # the messages' text, read before timing (as an agent holds its prompts)
            _marks["t_begin"] = time.time()
            outcome = runtime.start(store, AGENT, [str(N), ARGS["regime"], str(ARGS["iters"])],
                                    run_id="bench", strategy=ARGS.get("strategy", "continuation"))
            raise SystemExit(f"crash mode finished without the kill: {outcome}")
        outcome = runtime.resume(store, "bench")
    _marks["t_done"] = time.time()
    if outcome.status != "completed":
        raise SystemExit(f"the resumed run ended {outcome.status}: {outcome.error}")
    _write_out({"result": outcome.result})
    os._exit(0)


if __name__ == "__main__":
    main()
