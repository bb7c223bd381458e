"""Child process for the LangGraph peer: one run of the benchmark agent as a LangGraph graph.

Usage: python _child_langgraph.py '<json args>' with keys mode (crash | recover | complete),
n, regime, iters, db (sqlite path), effects (effect log path), out (result JSON path),
durability ("sync" unless told otherwise), delta (false unless told otherwise) and
snapshot_frequency (100 unless told otherwise).

The graph is one node, ``step``, looping on itself through a conditional edge until i == n;
each pass is one agent step (busy work, then the fake LLM call) and, with
``durability="sync"``, one checkpoint written to SqliteSaver before the next step starts.

With ``delta``, the channel that grows or changes by one message per step (the transcript in
regime "grow", the scratchpad in "mutate") is a ``DeltaChannel`` (beta in LangGraph 1.2): a
checkpoint stores only that step's write, plus the whole value every ``snapshot_frequency``
writes, and a resumed run rebuilds the value from the nearest snapshot and the writes after
it (``SqliteSaver.get_delta_channel_history``). Regime "const" has no such channel and runs
unchanged.

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
import sqlite3  # noqa: E402
import sys  # noqa: E402
from typing import Any, Annotated, Sequence, TypedDict  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _agent  # noqa: E402
from langgraph.channels.delta import DeltaChannel  # noqa: E402
from langgraph.checkpoint.sqlite import SqliteSaver  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402

T_IMPORTED = time.time()

ARGS = json.loads(sys.argv[1])
MODE: str = ARGS["mode"]
N: int = ARGS["n"]
MARKS = frozenset(ARGS.get("marks", ()))  # crash: prefix sizes timed on the way (_harness.step_run)
ITERS: int = ARGS["iters"]
DELTA: bool = ARGS.get("delta", False)
SNAPSHOT_FREQUENCY: int = ARGS.get("snapshot_frequency", 100)  # DeltaChannel's default
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


def append_messages(transcript: list[dict], writes: Sequence[dict | list[dict]]) -> list[dict]:
    """The transcript's DeltaChannel reducer: each write is one message (a step's) or a list
    of messages (the graph's input: none), appended in order, as LangGraph's own
    ``_messages_delta_reducer`` takes them. Batching-invariant, as DeltaChannel requires (a
    resumed run replays the stored writes in one batch): folding two batches one after the
    other appends what folding their concatenation once appends."""
    appended = list(transcript)
    for write in writes:
        if isinstance(write, list):
            appended.extend(write)
        else:
            appended.append(write)
    return appended


def merge_slots(memory: dict, writes: Sequence[dict]) -> dict:
    """The scratchpad's DeltaChannel reducer: each write maps slots to messages and the later
    write of a slot wins. Batching-invariant for the same reason as ``append_messages``."""
    merged = dict(memory)
    for write in writes:
        merged.update(write)
    return merged


class DeltaGrowState(TypedDict):
    i: int
    ok: bool
    last: str
    # a checkpoint holds this step's message, and every SNAPSHOT_FREQUENCY-th the whole list
    transcript: Annotated[list[dict], DeltaChannel(append_messages, snapshot_frequency=SNAPSHOT_FREQUENCY)]


class DeltaMutateState(TypedDict):
    i: int
    ok: bool
    last: str
    # a checkpoint holds the one slot this step rewrote, and every SNAPSHOT_FREQUENCY-th all 16
    memory: Annotated[dict, DeltaChannel(merge_slots, snapshot_frequency=SNAPSHOT_FREQUENCY)]


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
    _agent.note_mark(i, MARKS, _marks, _fd)
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
        # the delta is the message alone: a DeltaChannel turns message dicts in a list into
        # LangChain messages (a tool message without tool_call_id fails), and gives one written
        # alone an "id" (a uuid4) instead
        update["transcript"] = out if DELTA else [out]
    if "memory" in state:
        slot = {_agent.memory_slot(i): out}
        update["memory"] = slot if DELTA else {**state["memory"], **slot}  # the delta, or the whole value
    return update


def route(state: dict) -> str:
    return "step" if state["i"] < N else END


def build(saver: SqliteSaver):
    states = {"grow": GrowState, "mutate": MutateState}
    if DELTA:
        states = {"grow": DeltaGrowState, "mutate": DeltaMutateState}
    builder = StateGraph(states.get(ARGS["regime"], ConstState))
    builder.add_node("step", step)
    builder.add_edge(START, "step")
    builder.add_conditional_edges("step", route, ["step", END])
    return builder.compile(checkpointer=saver)


def main() -> None:
    durability = ARGS.get("durability", "sync")
    config = {"configurable": {"thread_id": THREAD_ID}, "recursion_limit": 2 * N + 10}
    _marks["t0"] = time.time()
    conn = sqlite3.connect(ARGS["db"], check_same_thread=False)
    saver = SqliteSaver(conn)
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
    conn.close()
    os._exit(0)


if __name__ == "__main__":
    main()
