"""What a benchmark run ran on: recorded in every raw file, so a number can be traced.

``begin(folder)`` is called before the first measurement and ``end(record)`` after the
last one.  The record holds the git commit (and whether the tree had uncommitted
changes), the interpreter and the versions of the libraries that matter, the kernel, the
file system the stores live on, what one fsync costs there (measured: it bounds every
``sync`` commit of every system), and the load average before and after, so a run on a
busy machine can be told from a quiet one.  Nothing here raises: a fact that cannot be
had is recorded as None, with the reason where there is one.
"""

from __future__ import annotations

import importlib.metadata
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
LIBRARIES = ("tcc", "lmdb", "zstandard", "blake3", "cloudpickle", "cryptography", "psycopg",
             "dbos", "langgraph", "langgraph-checkpoint-sqlite", "langgraph-checkpoint-postgres",
             "sqlalchemy", "matplotlib")
FSYNC_SAMPLES = 50


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for name in LIBRARIES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def file_system(folder: pathlib.Path) -> dict[str, Any]:
    """The mount that holds ``folder``: its type, device and options (from /proc/mounts)."""
    try:
        real = os.path.realpath(folder)
        best: list[str] | None = None
        with open("/proc/mounts") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) < 4:
                    continue
                mount = parts[1].replace("\\040", " ")
                inside = real == mount or real.startswith(mount.rstrip("/") + "/")
                if inside and (best is None or len(mount) >= len(best[1])):
                    best = parts
        if best is None:
            return {"path": real, "type": None}
        return {"path": real, "mount": best[1], "type": best[2], "device": best[0],
                "options": best[3]}
    except OSError as exc:
        return {"path": str(folder), "type": None, "why": str(exc)}


def fsync_cost(folder: pathlib.Path, samples: int = FSYNC_SAMPLES) -> dict[str, Any]:
    """Median and 90th percentile of one 4 KiB ``write`` + ``fsync`` in ``folder``."""
    path = folder / f".fsync-probe-{os.getpid()}"
    times: list[float] = []
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            block = os.urandom(4096)
            for i in range(samples):
                os.pwrite(fd, block, (i % 16) * 4096)
                t0 = time.perf_counter()
                os.fsync(fd)
                times.append(time.perf_counter() - t0)
        finally:
            os.close(fd)
            path.unlink(missing_ok=True)
    except OSError as exc:
        return {"median_s": None, "why": str(exc)}
    times.sort()
    return {"median_s": statistics.median(times), "p90_s": times[int(len(times) * 0.9) - 1],
            "samples": samples}


def _load() -> list[float] | None:
    try:
        return list(os.getloadavg())
    except OSError:
        return None


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def begin(folder: pathlib.Path) -> dict[str, Any]:
    """The provenance of a run about to measure in ``folder`` (where its stores go)."""
    folder.mkdir(parents=True, exist_ok=True)
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {
        "git_sha": _git("rev-parse", "HEAD"),
        "git_dirty": None if status is None else bool(status),
        "argv": sys.argv,
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "python_build": list(platform.python_build()),
        "executable": sys.executable,
        "libraries": _versions(),
        "kernel": platform.release(),
        "uname": " ".join(platform.uname()),
        "cpu_model": _cpu_model(),
        "cpus": os.cpu_count(),
        "file_system": file_system(folder),
        "fsync": fsync_cost(folder),
        "loadavg_before": _load(),
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def end(record: dict[str, Any]) -> dict[str, Any]:
    """Add what is known only when the run is over: the load average after it, and the
    commit and tree state again (a run spawns processes that import the tree as it is when
    they start: a file edited during the run is measured, though ``git_dirty`` was False)."""
    status = _git("status", "--porcelain", "--untracked-files=no")
    record["git_sha_at_end"] = _git("rev-parse", "HEAD")
    record["git_dirty_at_end"] = None if status is None else bool(status)
    record["loadavg_after"] = _load()
    record["ended_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return record


def changed_during(record: dict[str, Any]) -> bool:
    """Whether the commit or the tree's cleanliness differed at the end of the run (older
    raw files, without the end state: False)."""
    if "git_dirty_at_end" not in record:
        return False
    return (record.get("git_sha_at_end") != record.get("git_sha")
            or bool(record.get("git_dirty_at_end")) != bool(record.get("git_dirty")))


def figures(record: dict[str, Any]) -> dict[str, str]:
    """The measured figures of ``record`` as ``describe`` prints them, those it has:
    ``fsync`` (ms, median), ``load_before`` and ``load_after`` (one-minute load average)."""
    found: dict[str, str] = {}
    fsync = (record.get("fsync") or {}).get("median_s")
    if fsync is not None:
        found["fsync"] = f"{fsync * 1e3:.2f}"
    before, after = record.get("loadavg_before"), record.get("loadavg_after")
    if before and after:
        found["load_before"], found["load_after"] = f"{before[0]:.2f}", f"{after[0]:.2f}"
    return found


def describe(record: dict[str, Any] | None) -> str:
    """One line for a rendered table's header."""
    if not record:
        return "provenance not recorded (an older raw file)"
    sha = (record.get("git_sha") or "unknown")[:12] + (" (dirty)" if record.get("git_dirty") else "")
    if changed_during(record):
        sha += " (the tree changed during the run)"
    fs = record.get("file_system") or {}
    shown = figures(record)
    parts = [f"commit {sha}", f"Linux {record.get('kernel')}",
             f"{fs.get('type') or '?'} file system"]
    if "fsync" in shown:
        parts.append(f"fsync {shown['fsync']} ms median")
    parts.append(f"load {shown['load_before']} → {shown['load_after']}" if "load_after" in shown
                 else "load unknown")
    return ", ".join(parts)
