"""tcc measured as a peer: the same crash / recover / complete children as DBOS and LangGraph
(``_harness.run_peer``), with the same t0 and the same storage measure, so the comparison
table sets like against like (``benchmarks.recovery`` also times tcc in-process in the
harness itself, for its strategies; this module is what the peer table compares).

tcc runs ``benchmarks/agent/agent.py`` (the contract in ``__init__.py``) with the continuation
strategy on the embedded LMDB store, default durability ``sync``, default retention (the
newest 3 snapshots).
"""

from __future__ import annotations

import importlib.metadata
import pathlib
from typing import Any, Callable

from . import _harness

PEER = "tcc"
_CHILD = pathlib.Path(__file__).with_name("_child_tcc.py")

NOTES = (
    "tcc {version}, continuation strategy, LMDB store (durability sync, the newest 3 snapshots"
    " kept): a snapshot of the agent's suspended frames is committed with each effect's"
    " completion. Recovery = fresh process, open_store (open_s), then tcc.runtime.resume: claim,"
    " restore the newest snapshot, re-issue the call in flight (resume_to_step_s); nothing is"
    " replayed."
)


def available() -> bool:
    return True  # the package under test


def version() -> str:
    try:
        return importlib.metadata.version("tcc")
    except importlib.metadata.PackageNotFoundError:
        return "source"


def _breakdown(rec: dict[str, Any]) -> dict[str, float]:
    return {"open_s": rec["t_opened"] - rec["t0"],
            "resume_to_step_s": rec["t_new_step"] - rec["t_opened"]}


def measure(n: int, *, regime: str = "const", work_ms: float = 0.0, repeats: int = 3,
            workdir: pathlib.Path, work_iters: int | None = None,
            before_recover: Callable[[dict[str, Any]], None] | None = None,
            strategy: str = "continuation") -> dict[str, Any]:
    """Crash the tcc agent after n-1 steps ``repeats`` times and measure its recovery, as the
    other peers are measured.  Returns the dict described in ``benchmarks/peers/__init__.py``."""
    return _harness.run_peer(
        peer=PEER, version=version(), script=_CHILD, n=n, regime=regime, work_ms=work_ms,
        work_iters=work_iters, repeats=repeats, workdir=workdir, breakdown=_breakdown,
        notes=NOTES.format(version=version()), store="folder", before_recover=before_recover,
        extra_args={"strategy": strategy},
    )


def measure_steps(n: int, *, marks: list[int], regime: str = "const", workdir: pathlib.Path,
                  strategy: str = "continuation") -> dict[int, float]:
    """The mean step of the tcc agent's first m-1 steps for each m in ``marks`` and n, from
    one crash child (``_harness.step_run``)."""
    return _harness.step_run(_CHILD, n=n, regime=regime, marks=marks, workdir=workdir, store="folder",
                             extra_args={"strategy": strategy})
