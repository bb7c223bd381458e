"""Child process for the LangGraph peer on PostgreSQL: ``_child_langgraph.py`` with
``PostgresSaver`` (langgraph-checkpoint-postgres) instead of ``SqliteSaver``.

Usage: python pg_child_langgraph.py '<json args>' with keys mode (crash | recover | complete),
n, regime, iters, url (postgresql:// URL of the database), effects (effect log path), out
(result JSON path), durability ("sync" unless told otherwise).

The graph is the SQLite child's: one node, ``step``, looping on itself through a conditional
edge until i == n; with ``durability="sync"`` the checkpoint of step i is committed before
step i+1 starts.  The saver is ``PostgresSaver.from_conn_string(url)`` (one psycopg 3
connection, autocommit, as LangGraph documents it) and ``saver.setup()`` runs in every
process inside the timed open, as a deployed application calls it at start-up (SqliteSaver
runs its own setup lazily on first use, also inside the timed window).

- crash: invoke the graph; at the START of step n-1 write {"t_begin", "t_kill"} and SIGKILL
  this process, so steps 0..n-2 are checkpointed and step n-1 is not.
- recover: open the saver and ``graph.invoke(None, config)``; at the start of the first new
  step (n-1) write the timestamps and os._exit(0) at once.
- complete: resume and let the graph finish; write its result.
"""

import time

T_PROC = time.time()  # first statement: interpreter start-up is before, imports after

import json  # noqa: E402
import operator  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
from typing import Any, Annotated, TypedDict  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _agent  # noqa: E402
from langgraph.checkpoint.postgres import PostgresSaver  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402

T_IMPORTED = time.time()

ARGS = json.loads(sys.argv[1])
MODE: str = ARGS["mode"]
N: int = ARGS["n"]
ITERS: int = ARGS["iters"]
THREAD_ID = "tcc-bench-agent"
_fd = os.open(ARGS["effects"], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
_marks: dict[str, float] = {"t_proc": T_PROC, "t_imported": T_IMPORTED}


class ConstState(TypedDict):
    i: int
    ok: bool
    last: str


class GrowState(TypedDict):
    i: int
    ok: bool
    last: str
    transcript: Annotated[list[dict], operator.add]  # list reducer: one message per step


class MutateState(TypedDict):
    i: int
    ok: bool
    last: str
    memory: dict  # a scratchpad of 16 messages, one rewritten per step (the channel's whole value)


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


def fake_llm_node(i: int) -> Any:
    if i == N - 1:
        _first_new_step_hook()
    os.write(_fd, b"%d\n" % i)  # the step's side effect (counts executions)
    return _agent.fake_llm(i, ARGS["regime"])


def step(state: dict) -> dict:
    i = state["i"]
    _agent.busy_work(ITERS)  # prompt building / parsing between steps
    out = fake_llm_node(i)
    update = _agent.scalar_update(state, i, out)
    if "transcript" in state:
        update["transcript"] = [out]
    if "memory" in state:
        update["memory"] = {**state["memory"], _agent.memory_slot(i): out}
    return update


def route(state: dict) -> str:
    return "step" if state["i"] < N else END


def build(saver: PostgresSaver):
    builder = StateGraph({"grow": GrowState, "mutate": MutateState}.get(ARGS["regime"], ConstState))
    builder.add_node("step", step)
    builder.add_edge(START, "step")
    builder.add_conditional_edges("step", route, ["step", END])
    return builder.compile(checkpointer=saver)


def main() -> None:
    durability = ARGS.get("durability", "sync")
    config = {"configurable": {"thread_id": THREAD_ID}, "recursion_limit": 2 * N + 10}
    _marks["t0"] = time.time()
    with PostgresSaver.from_conn_string(ARGS["url"]) as saver:
        saver.setup()
        graph = build(saver)
        _marks["t_opened"] = time.time()
        if MODE == "crash":
            _agent.warm()  # the messages' text, read before timing (as an agent holds its prompts)
            _marks["t_begin"] = time.time()
            result = graph.invoke(_agent.initial_state(ARGS["regime"]), config, durability=durability)
            raise SystemExit(f"crash mode finished without the kill: {result}")
        _marks["t_invoke"] = time.time()
        final = graph.invoke(None, config, durability=durability)
        _marks["t_done"] = time.time()
        _write_out({"result": _agent.final_result(final, N)})
    os._exit(0)


if __name__ == "__main__":
    main()
