"""Crash / recover / complete driver shared by the peer modules.

For each repeat, in a fresh directory:

1. **crash**: a child runs the agent from step 0 and SIGKILLs itself at the start of step n-1
   (steps 0..n-2 are recorded by the peer). It reports ``t_begin`` (just before the agent
   starts) and ``t_kill``; ``(t_kill - t_begin) / (n - 1)`` is the per-step cost with the peer.
2. **recover**: the parent notes ``t_spawn = time.time()`` and starts a fresh child, which
   recovers through the peer and writes ``t_new_step`` at the start of step n-1's body, then
   ``os._exit(0)`` (the run stays unfinished). whole-process = ``t_new_step - t_spawn``;
   in-process = ``t_new_step - t0`` with ``t0`` taken just before the peer's store is opened.

After the last repeat a **complete** child recovers the same (twice-interrupted) run and lets
it finish: that gives ``final_result``, the storage size after n steps, and the count of
effect executions over all three processes (n means no completed step ran twice).
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import statistics
import subprocess
import sys
import time
from typing import Any, Callable

from . import _agent

CHILD_TIMEOUT_S = 900.0


def fsync_4k_median_s(workdir: pathlib.Path, count: int = 21) -> float:
    """Median cost of a 4 KiB write + fsync in ``workdir`` now (a contention gauge)."""
    path = workdir / "fsync-probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    times = []
    try:
        for _ in range(count):
            os.pwrite(fd, b"x" * 4096, 0)
            t = time.perf_counter()
            os.fsync(fd)
            times.append(time.perf_counter() - t)
    finally:
        os.close(fd)
        path.unlink()
    return statistics.median(times)


def _run_child(script: pathlib.Path, args: dict[str, Any], *, expect_kill: bool) -> tuple[float, dict[str, Any]]:
    """Run one child; returns (t_spawn, the JSON it wrote)."""
    out = pathlib.Path(args["out"])
    if out.exists():
        out.unlink()
    t_spawn = time.time()
    proc = subprocess.run(
        [sys.executable, str(script), json.dumps(args)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
    )
    want = -signal.SIGKILL if expect_kill else 0
    if proc.returncode != want or not out.exists():
        raise RuntimeError(
            f"{script.name} mode={args['mode']} exited {proc.returncode} (wanted {want});"
            f" stderr tail:\n{proc.stderr[-3000:]}"
        )
    return t_spawn, json.loads(out.read_text())


def _child_args(run_dir: pathlib.Path, *, n: int, regime: str, iters: int, store: str,
                extra_args: dict[str, Any] | None) -> tuple[pathlib.Path, dict[str, Any]]:
    """(the peer's data path, the arguments every child of a run in ``run_dir`` gets): the
    store a ``folder`` (tcc, ``store``) or a SQLite file (``db``), and the effect log."""
    data = run_dir / ("store" if store == "folder" else "peer.sqlite")
    return data, {"n": n, "regime": regime, "iters": iters, ("store" if store == "folder" else "db"): str(data),
                  "effects": str(run_dir / "effects.log"), **(extra_args or {})}


def step_run(script: pathlib.Path, *, n: int, regime: str, marks: list[int], workdir: pathlib.Path,
             store: str = "sqlite", extra_args: dict[str, Any] | None = None) -> dict[int, float]:
    """One crash child only (no recovery): the agent runs from step 0 and is killed at the start
    of step n-1. Returns, for n and for each size m in ``marks`` (2 <= m < n), the mean step
    of the first m-1 steps, ``(t_m - t_begin) / (m - 1)``, with ``t_m`` noted at the start of
    step m-1: what a run of m steps would report by the crash formula above, because step i
    of the agent does the same whatever n is (its message is a function of i alone).  The
    per-step figure is the raw one, the agent's own work included (no ``bare`` subtracted).
    ``workdir`` is emptied and removed afterwards."""
    if n < 2 or any(not 2 <= m < n for m in marks):
        raise ValueError(f"marks must lie in [2, n) and n must be at least 2 (n={n}, marks={marks})")
    if regime not in _agent.REGIMES:
        raise ValueError(f"unknown regime {regime!r}; one of {', '.join(_agent.REGIMES)}")
    workdir = pathlib.Path(workdir)
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    try:
        _, base = _child_args(workdir, n=n, regime=regime, iters=0, store=store, extra_args=extra_args)
        args = {**base, "marks": sorted(marks), "mode": "crash", "out": str(workdir / "crash.json")}
        _, crashed = _run_child(script, args, expect_kill=True)
        logged = (workdir / "effects.log").read_bytes()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    # each step logs "i\n" after its mark: steps 0..m-2 logged at mark m, 0..n-2 at the kill
    at = {m: crashed[f"effects_at_{m}"] for m in marks}
    if logged != _effect_log(n - 1) or any(size != len(_effect_log(m - 1)) for m, size in at.items()):
        raise RuntimeError(f"{script.name}: the marks or the kill were not at the start of step m-1 "
                           f"(effects logged: {at} at the marks, {len(logged)} bytes at the kill, n={n})")
    times = {m: crashed[f"t_mark_{m}"] for m in marks}
    times[n] = crashed["t_kill"]
    return {m: (t - crashed["t_begin"]) / (m - 1) for m, t in sorted(times.items())}


def _effect_log(steps: int) -> bytes:
    """The effect log of a run whose steps 0..steps-1 ran once each."""
    return b"".join(b"%d\n" % i for i in range(steps))


def _file_bytes(db: pathlib.Path) -> int:
    """Bytes allocated on disk to a SQLite database with its WAL and rollback journal if
    present, or to every file under a store folder (tcc): the same measure for every
    system (blocks, not ``st_size``: a sparse or preallocated file counts what it holds)."""
    if db.is_dir():
        return sum(p.stat().st_blocks * 512 for p in db.rglob("*") if p.is_file())
    total = 0
    for suffix in ("", "-wal", "-journal"):
        p = db.with_name(db.name + suffix)
        if p.exists():
            total += p.stat().st_blocks * 512
    return total


def _count_lines(path: pathlib.Path) -> int:
    return len(path.read_bytes().splitlines()) if path.exists() else 0


def run_peer(
    *,
    peer: str,
    version: str,
    script: pathlib.Path,
    n: int,
    regime: str,
    work_ms: float,
    work_iters: int | None,
    repeats: int,
    workdir: pathlib.Path,
    breakdown: Callable[[dict[str, Any]], dict[str, float]],
    extra_args: dict[str, Any] | None = None,
    notes: str,
    store: str = "sqlite",
    before_recover: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """``store``: ``sqlite`` (the child gets ``db``, a SQLite file) or ``folder`` (tcc: the
    child gets ``store``, a folder it creates).  ``before_recover(args)`` runs between the
    crash and the recovery child of every repetition (given the children's arguments): the
    harness drops the page cache there, or invalidates what a reboot would."""
    if n < 2:
        raise ValueError("n must be at least 2 (the crash is at the start of step n-1)")
    if regime not in _agent.REGIMES:
        raise ValueError(f"unknown regime {regime!r}; one of {', '.join(_agent.REGIMES)}")
    if repeats < 1:
        raise ValueError("repeats must be at least 1")
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    iters = _agent.calibrate_work(work_ms) if work_iters is None else int(work_iters)
    fsync_s = fsync_4k_median_s(workdir)
    bare = _agent.bare_per_step_s(n, regime, iters, str(workdir / "bare-effects"))
    os.unlink(workdir / "bare-effects")

    whole: list[float] = []
    inproc: list[float] = []
    per_step: list[float] = []
    crash_bytes: list[int] = []
    parts: dict[str, list[float]] = {}
    run_dir = workdir
    for r in range(repeats):
        run_dir = workdir / f"{peer}-{regime}-n{n}-w{work_ms:g}-r{r}"
        run_dir.mkdir(parents=True, exist_ok=True)
        for stale in run_dir.iterdir():
            if stale.is_dir():
                shutil.rmtree(stale)
            else:
                stale.unlink()
        data, base = _child_args(run_dir, n=n, regime=regime, iters=iters, store=store, extra_args=extra_args)
        _, crashed = _run_child(script, {**base, "mode": "crash", "out": str(run_dir / "crash.json")}, expect_kill=True)
        per_step.append((crashed["t_kill"] - crashed["t_begin"]) / (n - 1) - bare)
        crash_bytes.append(_file_bytes(data))
        if before_recover is not None:
            before_recover(base)
        t_spawn, rec = _run_child(script, {**base, "mode": "recover", "out": str(run_dir / "recover.json")}, expect_kill=False)
        whole.append(rec["t_new_step"] - t_spawn)
        inproc.append(rec["t_new_step"] - rec["t0"])
        rec_parts = {
            "interpreter_start_s": rec["t_proc"] - t_spawn,
            "imports_s": rec["t_imported"] - rec["t_proc"],
            **breakdown(rec),
        }
        for k, v in rec_parts.items():
            parts.setdefault(k, []).append(v)

    _, done = _run_child(script, {**base, "mode": "complete", "out": str(run_dir / "complete.json")}, expect_kill=False)
    executions = _count_lines(run_dir / "effects.log")
    return {
        "peer": peer,
        "version": version,
        "n": n,
        "regime": regime,
        "work_ms": work_ms,
        "work_iters": iters,
        "repeats": repeats,
        "whole_process_s": whole,
        "in_process_s": inproc,
        "whole_process_median_s": statistics.median(whole),
        "in_process_median_s": statistics.median(inproc),
        "breakdown_s": parts,  # per repeat, same order as whole_process_s
        "per_step_overhead_s": statistics.median(per_step),
        "per_step_overhead_runs_s": per_step,
        "bare_step_s": bare,
        "storage_bytes": _file_bytes(data),
        "storage_bytes_at_crash": int(statistics.median(crash_bytes)),
        "final_result": done["result"],
        "effect_executions": executions,
        "duplicate_effects": executions - n,
        "fsync_4k_median_s": fsync_s,
        "python": sys.version.split()[0],
        "notes": notes,
    }


def write_results(results: pathlib.Path, name: str, raw: dict[str, Any],
                  render: Callable[[dict[str, Any]], str], log: Callable[[str], None]) -> int:
    """Write ``raw`` to ``results/NAME-TIME.json`` and its rendered table next to it (.md),
    log the table and every problem in ``raw["problems"]``; the exit status (1 if any)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = results / f"{name}-{stamp}.json"
    out.write_text(json.dumps(raw, indent=1, default=str))
    table = render(raw)
    out.with_suffix(".md").write_text(table + "\n")
    log("")
    log(table)
    log("")
    log(f"raw results: {out} ({raw['elapsed_s']:.0f} s)")
    for p in raw["problems"]:
        log(f"PROBLEM: {p}")
    return 1 if raw["problems"] else 0
