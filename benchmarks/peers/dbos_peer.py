"""DBOS peer: the benchmark agent as a ``@DBOS.workflow`` with one ``@DBOS.step`` per step,
SQLite system database, SIGKILLed at the start of step n-1 and recovered by ``DBOS.launch()``.

All DBOS work happens in child processes (``_child_dbos.py``); this module only drives them,
so importing it does not import ``dbos``.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import pathlib
from typing import Any, Callable

from . import _harness

PEER = "dbos"
_CHILD = pathlib.Path(__file__).with_name("_child_dbos.py")

NOTES = (
    "DBOS {version}, SQLite system database (rollback journal, synchronous=FULL as DBOS sets"
    " it up), one @DBOS.workflow calling one @DBOS.step per agent step. Recovery =" 
    " fresh process, DBOS(config) + DBOS.launch(): launch finds the PENDING workflow and"
    " re-enqueues it on DBOS's internal queue, whose worker thread polls every 1.0 s"
    " (Queue default polling_interval_sec, +-5% jitter); the workflow then re-runs from the"
    " start, serving steps 0..n-2 from the recorded outputs (workflow code between steps,"
    " including work_ms, re-executes). breakdown_s: launch_s = DBOS(config)+launch(),"
    " queue_poll_wait_s = re-enqueued -> dequeued by the poller (the poll interval),"
    " replay_s = dequeued -> step n-1 body starts; in_process_excl_poll_s = in-process minus"
    " the poll wait. Python {python} links SQLite {sqlite}: DBOS 3.4 on Python >= 3.12 uses"
    " unixepoch('subsec') (SQLite >= 3.42){shim}."
)


def available() -> bool:
    """True when ``dbos`` is installed in this interpreter."""
    return importlib.util.find_spec("dbos") is not None


def version() -> str:
    return importlib.metadata.version("dbos")


def _breakdown(rec: dict[str, Any]) -> dict[str, float]:
    out = {
        "construct_s": rec["t_constructed"] - rec["t0"],
        "launch_s": rec["t_launched"] - rec["t0"],
    }
    if "t_reenqueued" in rec and "t_dequeued" in rec:
        poll = rec["t_dequeued"] - rec["t_reenqueued"]
        out["queue_poll_wait_s"] = poll
        out["replay_s"] = rec["t_new_step"] - rec["t_dequeued"]
        out["in_process_excl_poll_s"] = rec["t_new_step"] - rec["t0"] - poll
    return out


def measure(
    n: int,
    *,
    regime: str = "const",
    work_ms: float = 0.0,
    repeats: int = 3,
    workdir: pathlib.Path,
    work_iters: int | None = None,
    before_recover: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Crash the DBOS agent after n-1 steps ``repeats`` times and measure its recovery.

    ``work_iters`` overrides the calibration of ``work_ms`` (to reuse one calibration across
    peers and tcc). Returns the dict described in ``benchmarks/peers/__init__.py``.
    """
    import platform
    import sqlite3

    old = sqlite3.sqlite_version_info < (3, 42, 0)
    notes = NOTES.format(
        version=version(),
        python=platform.python_version(),
        sqlite=sqlite3.sqlite_version,
        shim=(
            ", which that SQLite lacks (DBOS.launch() then fails: NOT NULL constraint on"
            " application_versions.version_timestamp), so the child registers a one-argument"
            " Python unixepoch() that answers 'subsec' and defers other forms to the built-in"
            if old
            else "; no shim needed"
        ),
    )
    return _harness.run_peer(
        peer=PEER,
        version=version(),
        script=_CHILD,
        n=n,
        regime=regime,
        work_ms=work_ms,
        work_iters=work_iters,
        repeats=repeats,
        workdir=workdir,
        breakdown=_breakdown,
        notes=notes,
        before_recover=before_recover,
    )


def measure_steps(n: int, *, marks: list[int], regime: str = "const", workdir: pathlib.Path) -> dict[int, float]:
    """The mean step of the DBOS agent's first m-1 steps for each m in ``marks`` and n, from
    one crash child (``_harness.step_run``)."""
    return _harness.step_run(_CHILD, n=n, regime=regime, marks=marks, workdir=workdir)
