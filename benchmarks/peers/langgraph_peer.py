"""LangGraph peer: the benchmark agent as a one-node ``StateGraph`` looping on itself (one
superstep per agent step), ``SqliteSaver`` checkpointer, ``durability="sync"``, SIGKILLed at
the start of step n-1 and resumed by ``graph.invoke(None, config)``.

``measure(..., delta=True)`` is LangGraph's production option for a growing state, its
(beta) ``DeltaChannel``: the transcript ("grow") or the scratchpad ("mutate") is checkpointed
as each step's write, with the whole value only every ``snapshot_frequency`` writes.
``VARIANTS`` lists it as the peer "langgraph delta" (the step-cost comparison runs it).

All LangGraph work happens in child processes (``_child_langgraph.py``); importing this
module does not import ``langgraph``.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import pathlib
import types
from typing import Any, Callable

from . import _harness

PEER = "langgraph"
DELTA_PEER = "langgraph delta"
_CHILD = pathlib.Path(__file__).with_name("_child_langgraph.py")

NOTES = (
    "LangGraph {version} (langgraph-checkpoint {ckpt}, langgraph-checkpoint-sqlite {sqlite_saver}),"
    " SqliteSaver on sqlite3 (WAL, Python's default synchronous=FULL), one node 'step' looping"
    " through a conditional edge, invoked with durability={durability!r}: the checkpoint of"
    " step i is committed before step i+1 starts. The default durability='async' was reported"
    " (DESIGN.md s.5) to lose every completed step on SIGKILL with fast steps, restarting at"
    " step 0, so it is not what is measured. State: {{i, ok, last}} (const) plus"
    " transcript: Annotated[list[dict], operator.add] (grow, one ~1.7 KB message per step) or"
    " memory: dict (mutate, 16 messages, one rewritten per step); LangGraph writes the whole"
    " channel value at every checkpoint, so grow storage is ~O(n^2)."
    " Recovery = fresh process, sqlite3.connect + SqliteSaver + compile (open_s), then"
    " invoke(None, config) loads the latest checkpoint (invoke_to_step_s) and re-runs the"
    " node in flight; nothing is replayed."
)
DELTA_NOTES = (
    " Variant 'langgraph delta': the transcript (grow) or the scratchpad (mutate) is a"
    " DeltaChannel (beta) with snapshot_frequency={snapshot_frequency} and a batching-invariant"
    " reducer (append the messages; merge the slots, the later write winning); a step writes"
    " only its message (mutate: its one slot), a checkpoint stores no value of the channel"
    " except a whole snapshot every {snapshot_frequency} writes, and invoke(None, config)"
    " rebuilds it from the nearest snapshot and the stored writes after it"
    " (SqliteSaver.get_delta_channel_history), so grow storage is ~O(n^2 / snapshot_frequency)."
    " A grow step writes its message alone, to which LangGraph adds an 'id' (a uuid4; a message"
    " dict in a list it would turn into a LangChain message). const runs unchanged."
)


def available() -> bool:
    """True when ``langgraph`` and ``langgraph-checkpoint-sqlite`` are installed here."""
    return (
        importlib.util.find_spec("langgraph") is not None
        and importlib.util.find_spec("langgraph.checkpoint.sqlite") is not None
    )


def version() -> str:
    return importlib.metadata.version("langgraph")


def _breakdown(rec: dict[str, Any]) -> dict[str, float]:
    return {
        "open_s": rec["t_opened"] - rec["t0"],
        "invoke_to_step_s": rec["t_new_step"] - rec["t_invoke"],
    }


def measure(
    n: int,
    *,
    regime: str = "const",
    work_ms: float = 0.0,
    repeats: int = 3,
    workdir: pathlib.Path,
    work_iters: int | None = None,
    before_recover: Callable[[dict[str, Any]], None] | None = None,
    durability: str = "sync",
    delta: bool = False,
    snapshot_frequency: int = 100,
) -> dict[str, Any]:
    """Crash the LangGraph agent after n-1 steps ``repeats`` times and measure its recovery.

    ``work_iters`` overrides the calibration of ``work_ms``; ``durability`` is for
    experiments only (with "async" the crash may lose steps and the numbers mean something
    else). ``delta`` makes the growing or changing channel a ``DeltaChannel`` taking a whole
    snapshot every ``snapshot_frequency`` writes (100 is LangGraph's default; a smaller one
    lets a short run recover from a snapshot and the writes after it); the result's
    ``peer`` is then "langgraph delta". Returns the dict described in
    ``benchmarks/peers/__init__.py``.
    """
    notes = NOTES.format(
        version=version(),
        ckpt=importlib.metadata.version("langgraph-checkpoint"),
        sqlite_saver=importlib.metadata.version("langgraph-checkpoint-sqlite"),
        durability=durability,
    )
    extra_args = _extra_args(durability, delta, snapshot_frequency)
    if delta:
        notes += DELTA_NOTES.format(snapshot_frequency=snapshot_frequency)
    return _harness.run_peer(
        peer=DELTA_PEER if delta else PEER,
        version=version(),
        script=_CHILD,
        n=n,
        regime=regime,
        work_ms=work_ms,
        work_iters=work_iters,
        repeats=repeats,
        workdir=workdir,
        breakdown=_breakdown,
        extra_args=extra_args,
        notes=notes,
        before_recover=before_recover,
    )


def measure_steps(n: int, *, marks: list[int], regime: str = "const", workdir: pathlib.Path,
                  delta: bool = False, snapshot_frequency: int = 100) -> dict[int, float]:
    """The mean step of the LangGraph agent's first m-1 steps for each m in ``marks`` and n,
    from one crash child (``_harness.step_run``); ``delta`` as in ``measure``."""
    return _harness.step_run(_CHILD, n=n, regime=regime, marks=marks, workdir=workdir,
                             extra_args=_extra_args("sync", delta, snapshot_frequency))


def _extra_args(durability: str, delta: bool, snapshot_frequency: int) -> dict[str, Any]:
    """What the child is told besides the run: durability, and the DeltaChannel if any."""
    return {"durability": durability, **({"delta": True, "snapshot_frequency": snapshot_frequency} if delta else {})}


# Production variants of this peer, each with the ``available()`` and ``measure()`` of a peer
# module: ``benchmarks.recovery.step_costs`` runs them next to the plain peer.
VARIANTS = {DELTA_PEER: types.SimpleNamespace(available=available, version=version,
                                              measure=functools.partial(measure, delta=True),
                                              measure_steps=functools.partial(measure_steps, delta=True))}
