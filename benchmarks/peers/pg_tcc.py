"""tcc on its PostgreSQL store: one crash + recovery round at a time, for interleaving.

The same measurements ``benchmarks.recovery`` takes on LMDB, on a store that is only a URL
and a key file (``tcc init --store URL --key-file PATH``; every later command and
``open_store`` get both, here through ``$TCC_STORE`` / ``$TCC_STORE_KEY_FILE`` for the CLI):

1. **crash** (``pg_child_tcc.py``): run ``bench`` of ``benchmarks/agent/agent.py``, continuation
   strategy, SIGKILLed at the start of step n-1; per-step overhead = (t_kill - t_begin) /
   (n - 1) - the bare loop's step, as the peers' children measure it;
2. **in-process recovery** in a fresh child (``pg_child_tcc.py`` recover), timed as the
   peers' children time theirs: t0 just before the store is opened, tcc, psycopg and the
   agent imported before it -> ``runtime.resume`` -> the first new effect, on a copy of the
   crashed database (``CREATE DATABASE ... TEMPLATE``: recovery writes to the store);
3. **whole-process recovery** as ``recovery.whole_process``: ``tcc resume bench`` spawned ->
   the first new effect (``BENCH_FIRST``), on the crashed database itself;
4. after the last round, ``tcc resume --json bench`` on a third copy runs to the end: the
   final result and the storage after n steps.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import time
from typing import Any

from benchmarks.recovery import env_for, tcc_cmd

from . import _harness
from .pg_server import Server

CHILD = pathlib.Path(__file__).resolve().with_name("pg_child_tcc.py")
NOTES = (
    "tcc {version} on its PostgreSQL store (the benchmark's server), benchmarks/agent/agent.py,"
    " continuation strategy (a snapshot after every effect), durability sync. Crash run:"
    " pg_child_tcc.py (tcc.runtime.start, what `tcc run` calls). In-process recovery is"
    " measured in a fresh child as the peers' (pg_child_tcc.py recover: store open -> first new"
    " effect, tcc, psycopg and the agent imported before t0), on a CREATE DATABASE ... TEMPLATE"
    " copy of the crashed store; whole process = `tcc resume bench` spawned -> first new effect."
)


def available() -> tuple[bool, str]:
    """Whether this tcc has a PostgreSQL store: ``tcc init`` exists and takes ``--key-file``."""
    proc = subprocess.run(tcc_cmd("init", "--help"), capture_output=True, text=True,
                          env=env_for(pathlib.Path(".")))
    if proc.returncode != 0:
        return False, "`tcc init` does not exist in this tcc"
    if "--key-file" not in proc.stdout:
        return False, "`tcc init` takes no --key-file"
    return True, ""


def version() -> str:
    from tcc import _version

    return str(getattr(_version, "__version__", getattr(_version, "version", "?")))


def whole_process(url: str, key_file: str, scratch: pathlib.Path) -> float:
    """``tcc resume bench`` spawned -> first new effect (``recovery.whole_process``)."""
    marker = scratch / "first.txt"
    marker.unlink(missing_ok=True)
    env = env_for(url, TCC_STORE_KEY_FILE=key_file, BENCH_FIRST=str(marker))
    t0 = time.time()
    proc = subprocess.run(tcc_cmd("resume", "bench"), env=env, capture_output=True, text=True, timeout=3600)
    if not marker.exists():
        raise RuntimeError(f"`tcc resume` never reached a new effect (exit {proc.returncode}): {proc.stderr[-3000:]}")
    return float(marker.read_text()) - t0


class TccCase:
    """tcc at one (n, regime, iters): rounds, then :meth:`finish`."""

    def __init__(self, srv: Server, *, n: int, label: str, iters: int, bare_s: float,
                 workdir: pathlib.Path) -> None:
        if n < 2:
            raise ValueError("n must be at least 2 (the crash is at the start of step n-1)")
        self.srv, self.n, self.label, self.iters, self.bare_s = srv, n, label, iters, bare_s
        self.workdir = workdir
        self.samples: dict[str, list[Any]] = {"per_step_s": [], "in_process_s": [], "whole_process_s": [],
                                              "storage_at_crash": []}
        self.breakdown: dict[str, list[float]] = {"init_s": [], "crash_run_s": [], "interpreter_start_s": [],
                                                  "imports_s": [], "open_s": [], "open_to_step_s": []}
        self.last: tuple[str, str] | None = None  # (database to finish, key file)

    def _init(self, db: str) -> tuple[str, str]:
        url = self.srv.create(db)
        key = self.workdir / f"{db}.key"
        key.unlink(missing_ok=True)
        t = time.perf_counter()
        proc = subprocess.run(tcc_cmd("init", "--store", url, "--key-file", str(key)),
                              env=env_for(url), capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"`tcc init --store {url}` failed ({proc.returncode}): {proc.stderr[-3000:]}")
        self.breakdown["init_s"].append(time.perf_counter() - t)
        return url, str(key)

    def round(self, r: int) -> None:
        db = f"tcc_{self.label}_{self.n}_r{r}"
        url, key = self._init(db)
        args = {"mode": "crash", "n": self.n, "regime": "const", "work_iters": self.iters, "url": url,
                "key_file": key, "out": str(self.workdir / f"{db}-crash.json")}
        t = time.perf_counter()
        _, crashed = _harness._run_child(CHILD, args, expect_kill=True)
        self.breakdown["crash_run_s"].append(time.perf_counter() - t)
        self.samples["per_step_s"].append((crashed["t_kill"] - crashed["t_begin"]) / (self.n - 1) - self.bare_s)
        self.samples["storage_at_crash"].append(self.srv.bytes_of(db))
        fin_url = self.srv.create(f"{db}_fin", template=db)  # untouched, for finish()
        del fin_url
        ip_url = self.srv.create(f"{db}_ip", template=db)
        self.srv.checkpoint()
        self.samples["in_process_s"].append(self._recover_in_child(ip_url, key, db))
        self.srv.drop(f"{db}_ip")
        self.srv.checkpoint()
        self.samples["whole_process_s"].append(whole_process(url, key, self.workdir))
        self.srv.drop(db)
        if self.last is not None:
            self.srv.drop(self.last[0])
        self.last = (f"{db}_fin", key)

    def _recover_in_child(self, url: str, key: str, db: str) -> float:
        """In-process recovery in a fresh child (``pg_child_tcc.py`` recover): t0 -> first new
        effect, with the child's start-up and imports broken out as the peers' are."""
        args = {"mode": "recover", "n": self.n, "regime": "const", "work_iters": self.iters, "url": url,
                "key_file": key, "out": str(self.workdir / f"{db}-recover.json")}
        t_spawn, got = _harness._run_child(CHILD, args, expect_kill=False)
        parts = self.breakdown
        parts["interpreter_start_s"].append(got["t_proc"] - t_spawn)
        parts["imports_s"].append(got["t_imported"] - got["t_proc"])
        parts["open_s"].append(got["t_opened"] - got["t0"])
        parts["open_to_step_s"].append(got["t_new_step"] - got["t_opened"])
        return float(got["t_new_step"] - got["t0"])

    def finish(self) -> dict[str, Any]:
        assert self.last is not None, "no round ran"
        db, key = self.last
        url = self.srv.url(db)
        proc = subprocess.run(tcc_cmd("resume", "--json", "bench"), env=env_for(url, TCC_STORE_KEY_FILE=key),
                              capture_output=True, text=True, timeout=3600)
        if proc.returncode != 0:
            raise RuntimeError(f"`tcc resume --json bench` did not complete ({proc.returncode}): {proc.stderr[-3000:]}")
        result = json.loads(proc.stdout)["result"]
        storage = self.srv.bytes_of(db)
        self.srv.drop(db)
        return {
            "system": "tcc", "version": version(), "n": self.n, "regime": self.label, "work_iters": self.iters,
            "bare_step_s": self.bare_s, **self.samples, "breakdown_s": self.breakdown,
            "storage_after_n": storage, "final_result": result, "python": sys.version.split()[0],
            "notes": NOTES.format(version=version()),
        }
