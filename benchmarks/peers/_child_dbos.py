"""Child process for the DBOS peer: one run of the benchmark agent as a DBOS workflow.

Usage: python _child_dbos.py '<json args>' with keys mode (crash | recover | complete), n,
regime, iters, db (sqlite path), effects (effect log path), out (result JSON path).

- crash: start the workflow; at the START of step n-1 write {"t_begin", "t_kill"} and SIGKILL
  this process, so steps 0..n-2 are recorded and step n-1 is not.
- recover: DBOS(config) + DBOS.launch() recovers the pending workflow; at the start of the
  first new step (n-1) write the timestamps and os._exit(0) at once (the workflow stays pending).
- complete: recover and let the workflow finish; write its result.
"""

import time

T_PROC = time.time()  # first statement: interpreter start-up is before, imports after

import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _agent  # noqa: E402
from dbos import DBOS, SetWorkflowID  # noqa: E402

T_IMPORTED = time.time()

ARGS = json.loads(sys.argv[1])
MODE: str = ARGS["mode"]
N: int = ARGS["n"]
MARKS = frozenset(ARGS.get("marks", ()))  # crash: prefix sizes timed on the way (_harness.step_run)
WORKFLOW_ID = "tcc-bench-agent"
_fd = os.open(ARGS["effects"], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
_marks: dict[str, float] = {"t_proc": T_PROC, "t_imported": T_IMPORTED}


def _write_out(extra: dict) -> None:
    tmp = ARGS["out"] + ".tmp"
    with open(tmp, "w") as f:
        json.dump({**_marks, **extra}, f)
    os.replace(tmp, ARGS["out"])


def _first_new_step_hook() -> None:
    now = time.time()
    if MODE == "crash":
        _write_out({"t_kill": now})
        os.kill(os.getpid(), signal.SIGKILL)
    elif MODE == "recover":
        _write_out({"t_new_step": now})
        os._exit(0)


@DBOS.step()
def llm_step(i: int, regime: str) -> object:
    _agent.note_mark(i, MARKS, _marks, _fd)
    if i == N - 1:
        _first_new_step_hook()
    os.write(_fd, b"%d\n" % i)  # the step's side effect (counts executions)
    return _agent.fake_llm(i, regime)


@DBOS.workflow()
def agent_workflow(n: int, regime: str, iters: int) -> dict:
    state = _agent.initial_state(regime)
    for i in range(n):
        _agent.busy_work(iters)  # prompt building / parsing between steps
        out = llm_step(i, regime)
        _agent.advance(state, i, out)
    return _agent.final_result(state, n)


def _sqlite_subsec_shim() -> None:
    """DBOS 3.4 on Python >= 3.12 writes timestamps with ``unixepoch('subsec')``, a form SQLite
    added in 3.42. A Python linked against an older SQLite (3.40.1 here) gets NULL, and
    ``DBOS.launch()`` fails on a NOT NULL constraint. Register a one-argument ``unixepoch``
    on every new SQLAlchemy connection that handles 'subsec' and defers everything else to
    the built-in. Only installed when the linked SQLite is too old."""
    import sqlite3

    if sqlite3.sqlite_version_info >= (3, 42, 0):
        return
    import sqlalchemy as sa

    builtin = sqlite3.connect(":memory:", check_same_thread=False)

    def unixepoch(arg):
        if arg == "subsec":
            return time.time_ns() // 1_000_000 / 1000.0
        return builtin.execute("SELECT unixepoch(?)", (arg,)).fetchone()[0]

    def on_connect(dbapi_conn, _record) -> None:
        if isinstance(dbapi_conn, sqlite3.Connection):
            dbapi_conn.create_function("unixepoch", 1, unixepoch)

    sa.event.listen(sa.engine.Engine, "connect", on_connect)
    _marks["sqlite_subsec_shim"] = 1.0


def _instrument() -> None:
    """Timestamp DBOS's recovery phases: re-enqueue of the pending workflow, dequeue by the
    internal queue's poller (the poll interval), then the replay up to the first new step."""
    import dbos._queue as dq
    import dbos._recovery as dr

    orig_recover = dr._recover_workflow
    orig_execute = dq.execute_dequeued_workflow

    def recover(*a, **kw):
        _marks.setdefault("t_reenqueue_start", time.time())
        try:
            return orig_recover(*a, **kw)
        finally:
            _marks.setdefault("t_reenqueued", time.time())

    def execute(*a, **kw):
        _marks.setdefault("t_dequeued", time.time())
        return orig_execute(*a, **kw)

    dr._recover_workflow = recover
    dq.execute_dequeued_workflow = execute


def main() -> None:
    config = {
        "name": "tcc-bench-peer",
        "system_database_url": f"sqlite:///{ARGS['db']}",
        "log_level": "ERROR",
    }
    _sqlite_subsec_shim()
    if MODE in ("recover", "complete"):
        _instrument()
    _marks["t0"] = time.time()
    DBOS(config=config)
    _marks["t_constructed"] = time.time()
    DBOS.launch()
    _marks["t_launched"] = time.time()
    if MODE == "crash":
        _agent.warm()  # the messages' text, read before timing (as an agent holds its prompts)
        _marks["t_begin"] = time.time()
        with SetWorkflowID(WORKFLOW_ID):
            result = agent_workflow(N, ARGS["regime"], ARGS["iters"])
        raise SystemExit(f"crash mode finished without the kill: {result}")
    # recover / complete: DBOS.launch() already re-enqueued the pending workflow
    result = DBOS.retrieve_workflow(WORKFLOW_ID).get_result()
    _marks["t_done"] = time.time()
    _write_out({"result": result})
    DBOS.destroy()
    os._exit(0)


if __name__ == "__main__":
    main()
