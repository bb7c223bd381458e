"""DBOS and LangGraph on PostgreSQL: one crash + recovery round at a time, for interleaving.

``benchmarks.peers._harness.run_peer`` runs every repeat of one peer back to back on a
SQLite file; ``benchmarks.postgres`` interleaves the systems instead (tcc, DBOS, LangGraph,
tcc, DBOS, ...), so it drives the same three child modes itself, one round per call, with
the SQLite children's PostgreSQL twins (``pg_child_dbos.py``, ``pg_child_langgraph.py``):

1. **crash** in a fresh database: the child runs the agent and SIGKILLs itself at the start
   of step n-1; per-step overhead = (t_kill - t_begin) / (n - 1) - the bare loop's step;
2. **recover**: a fresh child recovers and stops at the start of step n-1; whole process =
   first new step - spawn, in-process = first new step - just before the store is opened;
3. after the last round, **complete** recovers the (twice interrupted) run of that round to
   the end: the final result, the storage after n steps and the count of effect executions.

Everything peer-specific (what to time, the breakdown) is reused from ``dbos_peer`` and
``langgraph_peer``.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import pathlib
from typing import Any, Callable

from . import _harness, dbos_peer, langgraph_peer
from .pg_server import Server

HERE = pathlib.Path(__file__).resolve().parent

NOTES = {
    "dbos": (
        "DBOS {version}, system_database_url=postgresql://... on the benchmark's server, one"
        " @DBOS.workflow calling one @DBOS.step per agent step (pg_child_dbos.py, otherwise"
        " _child_dbos.py). Recovery = fresh process, DBOS(config) + DBOS.launch(), which"
        " re-enqueues the PENDING workflow on its internal queue (polled every 1.0 s) and"
        " re-runs it from the start against the recorded step outputs; breakdown_s as in"
        " dbos_peer (queue_poll_wait_s is the poll interval)."
    ),
    "langgraph": (
        "LangGraph {version} (langgraph-checkpoint-postgres {pg_saver}), PostgresSaver on one"
        " psycopg 3 connection (autocommit, from_conn_string), durability='sync': the checkpoint"
        " of step i is committed before step i+1 starts; setup() runs in every process inside"
        " the timed open (open_s). One node looping through a conditional edge"
        " (pg_child_langgraph.py, otherwise _child_langgraph.py); recovery = invoke(None, config)"
        " loads the latest checkpoint and re-runs the node in flight."
    ),
}


def available(peer: str) -> bool:
    if peer == "dbos":
        return dbos_peer.available()
    return (langgraph_peer.available()
            and importlib.util.find_spec("langgraph.checkpoint.postgres") is not None)


def version(peer: str) -> str:
    return dbos_peer.version() if peer == "dbos" else langgraph_peer.version()


def notes(peer: str) -> str:
    if peer == "dbos":
        return NOTES["dbos"].format(version=version(peer))
    return NOTES["langgraph"].format(version=version(peer),
                                     pg_saver=importlib.metadata.version("langgraph-checkpoint-postgres"))


SCRIPTS = {"dbos": HERE / "pg_child_dbos.py", "langgraph": HERE / "pg_child_langgraph.py"}
BREAKDOWN: dict[str, Callable[[dict[str, Any]], dict[str, float]]] = {
    "dbos": dbos_peer._breakdown,
    "langgraph": langgraph_peer._breakdown,
}


def _count_lines(path: pathlib.Path) -> int:
    return len(path.read_bytes().splitlines()) if path.exists() else 0


class PeerCase:
    """One peer at one (n, regime, iters): rounds, then :meth:`finish`."""

    def __init__(self, peer: str, srv: Server, *, n: int, label: str, iters: int, bare_s: float,
                 workdir: pathlib.Path) -> None:
        if n < 2:
            raise ValueError("n must be at least 2 (the crash is at the start of step n-1)")
        self.peer, self.srv, self.n, self.label, self.iters, self.bare_s = peer, srv, n, label, iters, bare_s
        self.workdir = workdir
        self.samples: dict[str, list[Any]] = {"per_step_s": [], "in_process_s": [], "whole_process_s": [],
                                              "storage_at_crash": []}
        self.breakdown: dict[str, list[float]] = {}
        self.last: tuple[str, pathlib.Path, dict[str, Any]] | None = None

    def database(self, r: int) -> str:
        return f"{self.peer}_{self.label}_{self.n}_r{r}"

    def round(self, r: int) -> None:
        db = self.database(r)
        url = self.srv.create(db)
        run_dir = self.workdir / db
        run_dir.mkdir(parents=True, exist_ok=True)
        for stale in run_dir.iterdir():
            stale.unlink()
        base = {"n": self.n, "regime": "const", "iters": self.iters, "url": url,
                "effects": str(run_dir / "effects.log"), "durability": "sync"}
        script = SCRIPTS[self.peer]
        _, crashed = _harness._run_child(script, {**base, "mode": "crash", "out": str(run_dir / "crash.json")},
                                         expect_kill=True)
        self.samples["per_step_s"].append((crashed["t_kill"] - crashed["t_begin"]) / (self.n - 1) - self.bare_s)
        self.samples["storage_at_crash"].append(self.srv.bytes_of(db))
        self.srv.checkpoint()
        t_spawn, rec = _harness._run_child(script, {**base, "mode": "recover", "out": str(run_dir / "recover.json")},
                                           expect_kill=False)
        self.samples["whole_process_s"].append(rec["t_new_step"] - t_spawn)
        self.samples["in_process_s"].append(rec["t_new_step"] - rec["t0"])
        parts = {"interpreter_start_s": rec["t_proc"] - t_spawn, "imports_s": rec["t_imported"] - rec["t_proc"],
                 **BREAKDOWN[self.peer](rec)}
        for k, v in parts.items():
            self.breakdown.setdefault(k, []).append(v)
        if self.last is not None:  # only the last round's run is completed
            self.srv.drop(self.last[0])
        self.last = (db, run_dir, base)

    def finish(self) -> dict[str, Any]:
        assert self.last is not None, "no round ran"
        db, run_dir, base = self.last
        _, done = _harness._run_child(SCRIPTS[self.peer], {**base, "mode": "complete",
                                                           "out": str(run_dir / "complete.json")},
                                      expect_kill=False)
        executions = _count_lines(run_dir / "effects.log")
        storage = self.srv.bytes_of(db)
        self.srv.drop(db)
        return {
            "system": self.peer, "version": version(self.peer), "n": self.n, "regime": self.label,
            "work_iters": self.iters, "bare_step_s": self.bare_s, **self.samples,
            "breakdown_s": self.breakdown, "storage_after_n": storage, "final_result": done["result"],
            "effect_executions": executions, "duplicate_effects": executions - self.n,
            "notes": notes(self.peer),
        }
