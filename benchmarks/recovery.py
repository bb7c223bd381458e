"""Recovery benchmark harness: continuation vs hybrid vs replay, and real peers.

    python -m benchmarks.recovery --smoke    # ~2 minutes on 2 cores: CI smoke test
    python -m benchmarks.recovery --quick    # ~8-10 minutes on 2 cores
    python -m benchmarks.recovery --full     # adds N = 10,000

Writes raw JSON to ``benchmarks/results/``, with the run's provenance (git commit and
dirty flag, library versions, kernel, file system, measured fsync cost, load average
before and after: ``benchmarks/provenance.py``).  Only ``--full`` renders into the
committed ``paper/generated/``, the table in ``benchmarks/README.md`` and ``paper/tcc.md``
(from ``paper/tcc.in.md``, ``benchmarks/paper.py``); ``--smoke`` and
``--quick`` render next to their raw file (``benchmarks/results/NAME/``), so a short run
never replaces the paper's numbers.  ``python -m benchmarks.report FILE`` re-renders any
raw file (``--out DIR``).

What is measured (all strategies side by side, repetitions interleaved, the order of
the systems shuffled in every round with a recorded seed: A C B, B A C, ...):

* recovery latency after a SIGKILL inside step N-1, for N in the size list,
  in-process (open store -> continuation restored / journal replayed -> first
  new effect issued) and as a whole process (`tcc resume` spawned -> first new
  effect);
* three regimes: ``const`` (small constant state), ``grow`` (one chat message of real
  prose or source text, ~1.7 KB on average, appended to a transcript per step) and
  ``work`` (0.5 ms of CPU between effects); the steady-state and step-cost sections add
  ``mutate`` (a 16-message scratchpad, one slot rewritten per step);
* per-step cost while running, checkpoint overhead vs state size against a raw
  LMDB put+commit of the same bytes, store bytes per step;
* the Young-Daly interval from the measured checkpoint cost, against a
  measured sweep of hybrid K;
* DBOS and LangGraph running the same agent, when installed (``[peers]``): their
  recovery, and their mean step in each regime next to tcc's;
* with ``--full``, the same three on one throw-away PostgreSQL server, each on its
  production store there (tcc's PostgreSQL store, DBOS's ``system_database_url``,
  LangGraph's ``PostgresSaver``), next to a bare ``INSERT`` + ``COMMIT``:
  ``benchmarks/postgres.py``'s measurements, in this run's shuffled order.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import pathlib
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
AGENT = str(ROOT / "benchmarks" / "agent" / "agent.py")
RESULTS = ROOT / "benchmarks" / "results"

PROFILES = {
    "smoke": {"sizes": [10, 50], "repeats": 2, "regimes": ["const", "grow", "work"],
              "state_sizes": [1 << 10, 100 << 10], "k_sweep": [1, 4, 16], "peer_sizes": [10],
              "steady_sizes": [50, 200], "held_bytes": 1 << 20,
              "step_sizes": [5, 10], "step_regimes": ["const", "grow", "mutate"], "state_n": 20},
    "quick": {"sizes": [10, 100, 1000], "repeats": 3, "regimes": ["const", "grow", "work"],
              "state_sizes": [1 << 10, 10 << 10, 100 << 10, 1 << 20, 10 << 20],
              "k_sweep": [1, 4, 16, 64], "peer_sizes": [100, 1000],
              "steady_sizes": [100, 1000], "held_bytes": 10 << 20,
              "step_sizes": [100, 1000], "step_regimes": ["const", "grow", "mutate"], "state_n": 100},
    # --full must finish within an hour on 2 cores (issue #24) with 10 repetitions of every
    # case: the peers' recovery is compared at N = 1,000 (each repetition builds a new crashed
    # store per system, minutes at N = 10,000); a step-cost or steady-state run goes to its
    # regime's largest size and the smaller sizes are read off its first steps (step_costs).
    "full": {"sizes": [10, 100, 1000, 10000], "repeats": 10, "regimes": ["const", "grow", "work"],
             "state_sizes": [1 << 10, 10 << 10, 100 << 10, 1 << 20, 10 << 20],
             "k_sweep": [1, 4, 16, 64, 256], "peer_sizes": [1000],
             "steady_plan": {"grow": [100, 1000, 10000], "mutate": [100, 1000]}, "held_bytes": 100 << 20,
             "step_plan": {"const": [100, 1000], "grow": [100, 1000, 10000], "mutate": [100, 1000]},
             "builds": 2, "state_n": 100,
             "conditions": ["warm", "cold", "reboot"],
             # tcc, DBOS and LangGraph on one PostgreSQL server (benchmarks/postgres.py), each
             # on its production store there, at N = 1,000 (~3 minutes; a repetition at
             # N = 10,000 takes a minute, DBOS replaying every step to recover)
             "postgres": {"sizes": [1000], "repeats": 10, "regimes": ["const"],
                          "floor_block": 500}},
}
WORK_MS = 0.5
HYBRID_K = 16
STRATEGIES = {"continuation": ("continuation", ()), "hybrid": ("hybrid", ("--snapshot-every", str(HYBRID_K))),
              "replay": ("replay", ())}


WORK_ITERS: list[int] = []  # calibrated once per session, shared with the peers
# The order of the systems within a round is shuffled (a fixed order biased an earlier
# store benchmark by ~10%); ``main`` seeds it and records the seed in the raw file.
ORDER = random.Random(0)


def shuffled(items: Any) -> list[Any]:
    """``items`` in this round's order."""
    out = list(items)
    ORDER.shuffle(out)
    return out


def work_iters() -> int:
    if not WORK_ITERS:
        from benchmarks.peers._agent import calibrate_work

        WORK_ITERS.append(calibrate_work(WORK_MS))
    return WORK_ITERS[0]


def regime_args(regime: str) -> tuple[str, str]:
    return ("const", str(work_iters())) if regime == "work" else (regime, "0")


def compile_bytecode() -> None:
    """Byte-compile tcc's modules and the benchmarks' own, as ``pip install`` does for the
    peers in site-packages.  Without it, an editable install run under
    ``PYTHONDONTWRITEBYTECODE=1`` (set on some CI images) compiles ~75 tcc modules from
    source in every spawned ``tcc resume``: ~0.25 s of "whole-process recovery" that no
    installed copy of tcc pays.  The children then read the cached bytecode (the variable
    only stops them from writing it)."""
    import compileall

    import tcc

    for folder in (pathlib.Path(tcc.__file__).resolve().parent, ROOT / "benchmarks"):
        compileall.compile_dir(str(folder), quiet=1)


def tcc_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "tcc", *args]


def env_for(store: pathlib.Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BENCH_", "TCC_STORE"))}
    env.update(TCC_STORE=str(store), PYTHONPATH=str(ROOT), **extra)
    return env


def allocated(path: pathlib.Path) -> int:
    return sum(p.stat().st_blocks * 512 for p in path.rglob("*") if p.is_file())


# ------------------------------------------------------------- crashed runs


def build_crashed_run(work: pathlib.Path, strategy: str, n: int, regime: str,
                      k: int | None = None, kill_at: int | None = None) -> dict[str, Any]:
    """Run the agent and SIGKILL it inside step ``kill_at`` (default N-1)."""
    name, extra = STRATEGIES[strategy]
    if k is not None:
        extra = ("--snapshot-every", str(k))
    store = work / f"{strategy}{k or ''}-{regime}-{n}"
    store.parent.mkdir(parents=True, exist_ok=True)
    reg, work_ms = regime_args(regime)
    kill = n - 1 if kill_at is None else kill_at
    t0 = time.perf_counter()
    proc = subprocess.run(
        tcc_cmd("run", "--run-id", "bench", "--strategy", name, *extra, AGENT, str(n), reg, work_ms),
        env=env_for(store, BENCH_KILL_AT=str(kill)), capture_output=True, text=True, timeout=3600,
    )
    elapsed = time.perf_counter() - t0
    if proc.returncode != -9:
        raise RuntimeError(f"benchmark run did not die as planned ({proc.returncode}): {proc.stderr}")
    return {"store": store, "build_s": elapsed, "bytes": allocated(store), "steps_done": kill}


def copy_store(store: pathlib.Path, copy: pathlib.Path) -> None:
    """A fresh copy of the crashed store, in the state the crashed store itself is in.

    Each repetition recovers its own copy (recovery writes to the store).  A
    copy is a new file, so its first open would walk data.mdb (the verdict
    file names the inode it vouches for; see ``tcc.store._verified``), which
    the crashed store -- last changed by its writer's own commits -- is not.
    One untimed open walks the copy and re-establishes that state.  The copy
    is also synced to disk, as the crashed store's commits were: otherwise the
    first sync commit of the recovery pays for writing back the whole copy
    (~2 ms more at N = 10,000, growing with the store).
    """
    from tcc.store import open_store

    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(store, copy)
    for f in copy.rglob("*"):
        if f.is_file():
            fd = os.open(f, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    with open_store(copy, create=False):
        pass


def whole_process(store: pathlib.Path, scratch: pathlib.Path) -> float:
    copy = scratch / "wp"
    copy_store(store, copy)
    return in_place(copy, scratch)


def bare_interpreter() -> float:
    """``python -c pass`` spawned and reaped: the floor under any whole-process recovery,
    measured next to it (the hot-path goal is a `tcc resume` within 8x of it)."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return time.perf_counter() - t0


def in_process(store: pathlib.Path, scratch: pathlib.Path) -> float:
    from tcc import runtime
    from tcc.store import open_store

    copy = scratch / "ip"
    copy_store(store, copy)
    agent = runtime.load_script(AGENT)
    seen: list[float] = []

    def hook(_i: int) -> None:
        seen.append(time.perf_counter())
        raise agent.FirstEffect

    agent.Harness.in_process_hook[:] = [hook]
    try:
        t0 = time.perf_counter()
        with open_store(copy, create=False) as st:
            try:
                runtime.resume(st, "bench")
            except agent.FirstEffect:
                pass
    finally:
        agent.Harness.in_process_hook.clear()
    if not seen:
        raise RuntimeError("in-process recovery never reached a new effect")
    return seen[0] - t0


def finish(store: pathlib.Path, scratch: pathlib.Path) -> Any:
    copy = scratch / "fin"
    copy_store(store, copy)
    proc = subprocess.run(tcc_cmd("resume", "--json", "bench"), env=env_for(copy),
                          capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"recovery did not complete: {proc.stderr}")
    return json.loads(proc.stdout)["result"]


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def in_place(store: pathlib.Path, scratch: pathlib.Path) -> float:
    """Whole-process recovery of the crashed store itself, as the crash left it (no copy, no
    untimed open before): the last thing done with a build."""
    marker = scratch / "first.txt"
    marker.unlink(missing_ok=True)
    t0 = time.time()
    proc = subprocess.run(tcc_cmd("resume", "bench"), env=env_for(store, BENCH_FIRST=str(marker)),
                          capture_output=True, text=True, timeout=3600)
    if not marker.exists():
        raise RuntimeError(f"recovery never reached a new effect: {proc.stderr}")
    return float(marker.read_text()) - t0


def recovery_suite(profile: dict[str, Any], work: pathlib.Path, log: Any) -> list[dict[str, Any]]:
    """Recovery latency by regime, history length and strategy.

    ``builds`` crashed stores are made per case (each run and killed afresh), and the
    repetitions take them in turn, so that the variance between builds is sampled; each
    repetition recovers a fresh copy of its build (in-process, then as a process).  Last,
    each build is recovered in place, as the crash left it."""
    rows = []
    builds = profile.get("builds", 1)
    cases = [(regime, n) for regime in profile["regimes"] for n in profile["sizes"]]
    # recovery against state size (one history length; the agent rewrites one element per step)
    cases += [(f"size:{b}", profile["state_n"]) for b in profile["state_sizes"] if "state_n" in profile]
    for regime, n in cases:
        built = [{s: build_crashed_run(work / f"b{b}", s, n, regime) for s in shuffled(STRATEGIES)}
                 for b in range(builds)]
        samples: dict[str, dict[str, list[float]]] = {s: {"in": [], "whole": [], "place": []}
                                                      for s in STRATEGIES}
        bare: list[float] = []
        for rep in range(profile["repeats"]):
            for s in shuffled(STRATEGIES):  # interleaved, each round in its own order
                store = built[rep % builds][s]["store"]
                samples[s]["in"].append(in_process(store, work))
                samples[s]["whole"].append(whole_process(store, work))
                bare.append(bare_interpreter())
        # every build's run completes to the uninterrupted result (checked by ``check``)
        finished = {s: [finish(b[s]["store"], work) for b in built] for s in STRATEGIES}
        results = {s: finished[s][0] if all(r == finished[s][0] for r in finished[s]) else finished[s]
                   for s in STRATEGIES}
        for b in range(builds):
            for s in shuffled(STRATEGIES):
                samples[s]["place"].append(in_place(built[b][s]["store"], work))
        for s in STRATEGIES:
            row = {
                "regime": regime, "n": n, "strategy": s, "builds": builds,
                "in_process_s": samples[s]["in"], "whole_process_s": samples[s]["whole"],
                "in_place_whole_s": samples[s]["place"],
                "bare_interpreter_s": bare,
                "build_s": median([b[s]["build_s"] for b in built]),
                "store_bytes": median([b[s]["bytes"] for b in built]),
                "bytes_per_step": median([b[s]["bytes"] for b in built]) / max(1, built[0][s]["steps_done"]),
                "result": results[s],
            }
            rows.append(row)
            log(f"recovery {regime:>13} N={n:<6} {s:12} in-process {median(row['in_process_s']) * 1e3:9.2f} ms"
                f"  whole {median(row['whole_process_s']) * 1e3:8.1f} ms"
                f" ({median(row['whole_process_s']) / median(bare):.1f}x python -c pass)"
                f"  in place {median(row['in_place_whole_s']) * 1e3:8.1f} ms")
            for b in built:
                shutil.rmtree(b[s]["store"], ignore_errors=True)
    return rows


# ------------------------------------------------------ checkpoint overhead


def checkpoint_overhead(profile: dict[str, Any], work: pathlib.Path, log: Any) -> list[dict[str, Any]]:
    """Per-step time with a snapshot after every effect vs journal only, by state size, next to
    the marginal cost of the same bytes in a raw synced LMDB commit."""
    import lmdb

    from tcc import runtime
    from tcc.capture import dump_payload
    from tcc.store import open_store

    agent = runtime.load_script(AGENT)
    steps = 50  # the agent rewrites one 128-byte element of its state per step
    rows = []
    for size in profile["state_sizes"]:
        per: dict[str, list[float]] = {"continuation": [], "replay": []}
        for rep in range(profile["repeats"]):
            for strategy in shuffled(per):
                store_dir = work / f"ovh-{size}-{strategy}-{rep}"
                with open_store(store_dir) as st:
                    t0 = time.perf_counter()
                    runtime.start(st, AGENT, [str(steps), f"size:{size}", "0"], strategy=strategy)
                    per[strategy].append((time.perf_counter() - t0) / steps)
                shutil.rmtree(store_dir, ignore_errors=True)
        # The floor is marginal, as tcc's overhead is: a synced LMDB commit of a journal-sized
        # record with the snapshot's bytes in the same transaction, minus the same commit
        # without them (interleaved).
        blob = dump_payload([f"{j:08d}" * 16 for j in range(size // 128)])
        record = b"j" * 128
        env = lmdb.open(str(work / f"raw-{size}"), map_size=1 << 33, sync=True)
        timed: dict[bool, list[float]] = {True: [], False: []}
        for i in range(max(10, profile["repeats"] * 3)):
            for with_blob in shuffled([True, False]):
                t0 = time.perf_counter()
                with env.begin(write=True) as txn:
                    txn.put(b"j%d-%d" % (i, with_blob), record)
                    if with_blob:
                        txn.put(b"s%d" % i, blob)
                timed[with_blob].append(time.perf_counter() - t0)
        env.close()
        shutil.rmtree(work / f"raw-{size}", ignore_errors=True)
        floor = [max(0.0, median(timed[True]) - median(timed[False]))]
        overhead = median(per["continuation"]) - median(per["replay"])
        rows.append({"state_bytes": size, "snapshot_bytes": len(blob),
                     "step_s_continuation": per["continuation"], "step_s_journal_only": per["replay"],
                     "checkpoint_overhead_s": overhead, "raw_lmdb_commit_s": median(floor),
                     "raw_commit_with_s": timed[True], "raw_commit_without_s": timed[False],
                     "ratio_vs_raw": overhead / median(floor) if median(floor) else float("nan")})
        log(f"checkpoint state {size:>9,} B: overhead {overhead * 1e3:7.3f} ms/step, "
            f"raw LMDB marginal {median(floor) * 1e3:7.3f} ms")
        del agent.Harness.in_process_hook[:]
    return rows


# ------------------------------------------------------------ steady state

STEADY_TAIL = 100  # steps at the end of a run whose median step is reported


def step_gaps(agent: Any, folder: pathlib.Path, n: int, regime: str, strategy: str) -> list[float]:
    """Run the agent for ``n`` steps in-process in a new store at ``folder`` (removed after);
    the intervals between its consecutive steps, in seconds."""
    from tcc import runtime
    from tcc.store import open_store

    stamps: list[float] = []
    agent._agent.warm()  # as every peer child does before its timed loop
    agent.Harness.in_process_hook[:] = [lambda _i: stamps.append(time.perf_counter())]
    try:
        with open_store(folder) as st:
            runtime.start(st, AGENT, [str(n), regime, "0"], strategy=strategy)
    finally:
        agent.Harness.in_process_hook.clear()
        shutil.rmtree(folder, ignore_errors=True)
    return [b - a for a, b in zip(stamps, stamps[1:])]


def steady_state(profile: dict[str, Any], work: pathlib.Path, log: Any) -> list[dict[str, Any]]:
    """The cost of one step once a run is long: the median of the last steps' intervals.

    ``grow`` (a transcript + one chat message per step) and ``mutate`` (a 16-message
    scratchpad, one slot rewritten per step) at each size of ``steady_plan``, continuation (a
    snapshot after every effect) next to replay (journal only); and ``hold`` (an unchanged
    ``bytes`` of ``held_bytes`` kept all along) next to the same agent without it, at the
    smallest size.  Runs are in-process, repetitions interleaved.  One run per regime and
    strategy goes to the regime's largest size, and a smaller size N reads the last steps
    before step N of it: step i does the same whatever the run's length (as in
    ``step_costs``), so that is what a run of N steps would show."""
    from tcc import runtime

    agent = runtime.load_script(AGENT)
    plan = steady_plan(profile)
    small = min(min(sizes) for sizes in plan.values())
    runs = [(regime, sizes, strategy, regime) for regime, sizes in plan.items()
            for strategy in ("continuation", "replay")]
    runs += [("hold", [small], "continuation", f"hold:{profile['held_bytes']}"),
             ("hold", [small], "continuation", "const")]
    samples: dict[tuple[str, int, str, str], list[float]] = {
        (kind, n, strategy, regime): [] for kind, sizes, strategy, regime in runs for n in sizes}
    for rep in range(profile["repeats"]):
        for kind, sizes, strategy, regime in shuffled(runs):
            gaps = step_gaps(agent, work / f"steady-{kind}-{strategy}-{regime}-{rep}", max(sizes), regime, strategy)
            for n in sizes:  # a run of n steps has n - 1 gaps
                head = gaps[:n - 1]
                samples[(kind, n, strategy, regime)].append(median(head[-min(STEADY_TAIL, len(head) // 2):]))
    rows = [{"kind": kind, "n": n, "strategy": strategy, "regime": regime, "run_n": max(sizes),
             "step_s": samples[(kind, n, strategy, regime)]}
            for kind, sizes, strategy, regime in runs for n in sizes]
    for row in rows:
        log(f"steady {row['kind']:4} N={row['n']:<6} {row['strategy']:12} {row['regime']:>16} "
            f"{median(row['step_s']) * 1e3:7.3f} ms/step")
    return rows


def steady_plan(profile: dict[str, Any]) -> dict[str, list[int]]:
    """The sizes of each steady-state regime: ``steady_plan`` if the profile has one, else
    ``steady_sizes`` for both ``grow`` and ``mutate``."""
    if "steady_plan" in profile:
        return {regime: _sizes(sizes, "steady_plan") for regime, sizes in profile["steady_plan"].items()}
    return {regime: _sizes(profile["steady_sizes"], "steady_sizes") for regime in ("grow", "mutate")}


def _sizes(sizes: Any, what: str) -> list[int]:
    """A profile's run lengths, sorted, each once; a run needs two steps at least (the crash
    formula divides by N - 1)."""
    out = sorted({int(n) for n in sizes})
    if not out or out[0] < 2:
        raise ValueError(f"the profile's {what} must list sizes of at least 2 steps, not {sizes!r}")
    return out


# LangGraph keeps every checkpoint, each the whole state: on the growing transcript that is
# N^2/2 messages on disk (~87 GB at N = 10,000), so its step cost is measured up to here.
STEP_COST_MAX_N = {("langgraph", "grow"): 3000}


def step_costs(profile: dict[str, Any], work: pathlib.Path, log: Any) -> list[dict[str, Any]]:
    """What a step costs, tcc next to the installed peers and their production variants
    (LangGraph with DeltaChannel), in each regime of ``step_plan`` at each of its sizes.

    Every system, tcc continuation and tcc replay included (``peers/tcc_peer.py``), runs its
    crash child once per round for each regime, to the regime's largest size (the rounds
    interleave all systems and regimes in a shuffled order), and the figure at each size N is
    ``(t_N - t_begin) / (N - 1)``, ``t_N`` taken at the start of step N-1: the mean step over
    the first N-1 steps, with the agent's own work in it and the system's start-up out of
    it, measured the same way for all (``benchmarks/peers/_harness.py``, ``step_run``). A
    smaller size is the prefix of the largest size's run: step i does the same whatever N
    is, so this is the figure a run of N steps would give, at a tenth of the children.
    ``bare_step_s`` (the agent loop with no framework, measured once per size) is reported
    next to it.  The steady state (the last steps' median) is ``steady_state``'s business."""
    from benchmarks.peers import _agent, tcc_peer

    peer_mods = installed_peers(lambda _msg: None, variants=True)  # (peers() says why one is missing)
    if not peer_mods:  # tcc alone is the steady-state section's business
        log("step costs: no peer installed (pip install 'tcc[peers]'); skipped")
        return []
    plan = step_plan(profile)
    repeats = int(profile.get("step_repeats", profile["repeats"]))
    mods = dict(peer_mods)
    systems = ["tcc continuation", "tcc replay", *mods]
    runs = []  # (system, regime, the sizes its run covers)
    for regime, sizes in plan.items():
        for system in systems:
            covered = [n for n in sizes if n <= STEP_COST_MAX_N.get((system, regime), n)]
            for n in sorted(set(sizes) - set(covered)):
                log(f"steps {regime:6} N={n:<6} {system:17} not measured: it keeps every checkpoint of the "
                    "whole growing state")
            if covered:
                runs.append((system, regime, covered))
    samples: dict[tuple[str, int, str], list[float]] = {}
    for rep in range(repeats):
        for system, regime, sizes in shuffled(runs):  # every system and regime once per round
            top = max(sizes)
            measure = (functools.partial(tcc_peer.measure_steps, strategy=system.split(" ", 1)[1])
                       if system.startswith("tcc ") else mods[system].measure_steps)
            folder = work / f"steps-{system.replace(' ', '-')}-{regime}-{rep}"
            per_step = measure(top, marks=[n for n in sizes if n != top], regime=regime, workdir=folder)
            for n in sizes:
                samples.setdefault((regime, n, system), []).append(per_step[n])
            log(f"steps r{rep} {regime:6} {system:17} " + "  ".join(
                f"N={n}: {per_step[n] * 1e3:.3f}" for n in sizes) + " ms/step")
    rows: list[dict[str, Any]] = []
    for regime, sizes in plan.items():
        for n in sizes:
            bare = _agent.bare_per_step_s(n, regime, 0)
            for system, _, covered in (r for r in runs if r[1] == regime):
                if n in covered:
                    rows.append({"n": n, "regime": regime, "system": system, "bare_step_s": bare,
                                 "mean_step_s": samples[(regime, n, system)], "tail_step_s": [],
                                 "run_n": max(covered)})
    for row in rows:
        log(f"steps {row['regime']:6} N={row['n']:<6} {row['system']:17} median "
            f"{median(row['mean_step_s']) * 1e3:7.3f} ms/step (n = {len(row['mean_step_s'])})")
    return rows


def step_plan(profile: dict[str, Any]) -> dict[str, list[int]]:
    """The sizes at which each regime's step cost is given: ``step_plan`` if the profile has
    one, else every regime of ``step_regimes`` at every size of ``step_sizes`` (or
    ``peer_sizes``)."""
    if "step_plan" in profile:
        return {regime: _sizes(sizes, "step_plan") for regime, sizes in profile["step_plan"].items()}
    sizes = _sizes(profile.get("step_sizes", profile["peer_sizes"]), "step_sizes")
    return {regime: sizes for regime in profile.get("step_regimes", ["grow"])}


# -------------------------------------------------------------- Young-Daly


def young_daly(profile: dict[str, Any], work: pathlib.Path, overhead_rows: list[dict[str, Any]],
               log: Any, mtbf_s: float = 3600.0) -> dict[str, Any]:
    """Compare sqrt(2*C*MTBF) with a measured sweep of the hybrid interval K.

    For each K: the per-step time of an in-process run with a snapshot every
    K effects (regime ``work``), and the in-process recovery time after a
    crash in the middle of a snapshot interval.  The expected overhead per
    unit of work is (step_K - step_journal_only) / step_journal_only +
    recovery_K / MTBF; Young-Daly predicts its minimum at sqrt(2*C*MTBF).

    C is timed directly, inside the driver: the median time of one snapshot
    (capture + commit, with the effect's completion) in the K = 1 runs, minus
    the median time of the journal append it replaces in the journal-only
    runs.  (A difference of whole step times drowned C in the noise of a
    ~2 ms step and once came out negative.)
    """
    from tcc import runtime
    from tcc.runtime._driver import Driver
    from tcc.store import open_store

    n = max(profile["k_sweep"]) * 2 + 2
    iters = str(work_iters())
    timed: dict[str, list[float]] = {"snapshot": [], "journal": []}

    def per_step(strategy: str, k: int, time_parts: bool = False) -> float:
        folder = work / f"yd-run-{strategy}-{k}"
        real_snapshot = Driver.snapshot
        with open_store(folder) as st:
            if time_parts:
                real_append = st.append_completion

                def snapshot(self: Any, *args: Any, **kwargs: Any) -> Any:
                    t = time.perf_counter()
                    try:
                        return real_snapshot(self, *args, **kwargs)
                    finally:
                        timed["snapshot"].append(time.perf_counter() - t)

                def append(*args: Any, **kwargs: Any) -> Any:
                    t = time.perf_counter()
                    try:
                        return real_append(*args, **kwargs)
                    finally:
                        timed["journal"].append(time.perf_counter() - t)

                Driver.snapshot = snapshot  # type: ignore[method-assign]
                st.append_completion = append  # type: ignore[method-assign]
            try:
                t0 = time.perf_counter()
                runtime.start(st, AGENT, [str(n), "const", iters], strategy=strategy,
                              checkpoint_every=k)
                elapsed = (time.perf_counter() - t0) / n
            finally:
                Driver.snapshot = real_snapshot  # type: ignore[method-assign]
        shutil.rmtree(folder, ignore_errors=True)
        return elapsed

    base = median([per_step("replay", 1, time_parts=True) for _ in range(profile["repeats"])])
    sweep = []
    for k in profile["k_sweep"]:
        step_k = median([per_step("hybrid", k, time_parts=k == 1) for _ in range(profile["repeats"])])
        kill_at = max(1, min(n - 1, (n // k) * k - (k // 2) - 1 if k > 1 else n - 1))
        built = build_crashed_run(work, "hybrid", n, "work", k=k, kill_at=kill_at)
        rec = [in_process(built["store"], work) for _ in range(profile["repeats"])]
        shutil.rmtree(built["store"], ignore_errors=True)
        overhead = max(0.0, step_k - base) / base + median(rec) / mtbf_s
        sweep.append({"k": k, "n": n, "kill_at": kill_at, "step_s": step_k, "recovery_s": rec,
                      "expected_overhead": overhead})
    checkpoint_s = max(0.0, median(timed["snapshot"]) - median(timed["journal"]))
    k_opt = (2 * checkpoint_s * mtbf_s) ** 0.5 / base if base else float("nan")
    best = min(sweep, key=lambda r: r["expected_overhead"])
    log(f"young-daly: C={checkpoint_s * 1e3:.3f} ms, step={base * 1e3:.3f} ms, MTBF={mtbf_s:.0f} s "
        f"-> K_opt={k_opt:.1f}; best measured K={best['k']}")
    return {"mtbf_s": mtbf_s, "checkpoint_s": checkpoint_s, "step_s": base, "k_opt": k_opt,
            "best_measured_k": best["k"], "sweep": sweep,
            "snapshot_s": median(timed["snapshot"]), "journal_append_s": median(timed["journal"])}


# ------------------------------------------------------------------- peers


def installed_peers(log: Any, *, variants: bool = False) -> list[tuple[str, Any]]:
    """(name, module) of each peer harness whose peer is installed; ``log`` says why not.
    With ``variants``, each peer's production variants follow it (its module's ``VARIANTS``:
    "langgraph delta"), as (name, an object with the module's ``measure`` and ``measure_steps``)."""
    found = []
    for modname in ("dbos_peer", "langgraph_peer"):
        try:
            mod = __import__(f"benchmarks.peers.{modname}", fromlist=["measure"])
        except ImportError as exc:
            log(f"peers: {modname} cannot be imported ({exc}); skipped")
            continue
        if not mod.available():
            log(f"peers: {modname}: peer not installed (pip install 'tcc[peers]'); skipped")
            continue
        found.append((modname.split("_")[0], mod))
        if variants:
            found += list(getattr(mod, "VARIANTS", {}).items())
    return found


def postgres_section(profile: dict[str, Any], work: pathlib.Path, log: Any) -> dict[str, Any] | None:
    """tcc (its PostgreSQL store), DBOS (``system_database_url``) and LangGraph
    (``PostgresSaver``) on one throw-away PostgreSQL server, as ``benchmarks.postgres``
    measures them (per-step overhead, in-process and whole-process recovery, storage; the
    bare INSERT + COMMIT floor), with the profile's ``postgres`` settings and this run's
    shuffled order.  None when the profile has no such section; ``{"not_run": why}`` when
    no server can be started here (no PostgreSQL binaries) or no system is installed."""
    spec = profile.get("postgres")
    if spec is None:
        return None
    from benchmarks import postgres
    from benchmarks.peers import pg_server

    systems, skipped = postgres.installed_systems(list(postgres.SYSTEMS), log)
    if not systems:
        return {"not_run": "no system can run on PostgreSQL here: " + "; ".join(skipped.values())}
    folder = work / "postgres"
    folder.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        try:
            srv = stack.enter_context(pg_server.server(None, log))
        except (Exception, SystemExit) as exc:  # no initdb/postgres here: the rest stands
            log(f"postgres: no server could be started ({exc}); section skipped")
            return {"not_run": f"no PostgreSQL server could be started: {exc}"}
        try:
            raw = postgres.run(spec, systems, srv, folder, log, shuffled)
        except Exception as exc:  # noqa: BLE001 -- keep the hour of numbers measured before
            log(f"postgres: the section failed:\n{traceback.format_exc()}")
            return {"not_run": f"the PostgreSQL section failed: {exc!r}"}
    raw.update(profile_settings=spec, systems=systems, skipped=skipped)
    raw["problems"] = postgres.check(raw, systems)
    return raw


def drop_caches() -> None:
    """Write back and drop the page cache (root only): the next process reads its
    interpreter, its libraries and the store from disk, as after a redeploy onto a host."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as fh:
        fh.write("3\n")


def cold_cache(_args: dict[str, Any]) -> None:
    drop_caches()


def after_reboot(args: dict[str, Any]) -> None:
    """What a reboot changes for a recovery: a cold page cache and, for tcc, a verdict that no
    longer vouches for data.mdb (it names the boot id), so the open walks the store again."""
    if "store" in args:
        (pathlib.Path(args["store"]) / "verified").unlink(missing_ok=True)
    drop_caches()


CONDITIONS = {"warm": None, "cold": cold_cache, "reboot": after_reboot}


def condition_unavailable(condition: str) -> str | None:
    """Why ``condition`` cannot be set up here, or None."""
    if CONDITIONS[condition] is None:
        return None
    if os.geteuid() != 0 or not os.access("/proc/sys/vm/drop_caches", os.W_OK):
        return "dropping the page cache needs root and a writable /proc/sys/vm/drop_caches"
    return None


def merge_repeats(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One peer row from ``repeats=1`` rows of the same system and case (one per round):
    per-repeat lists are joined, per-repeat scalars listed and summarised by their median,
    and every round's final result must be the expected one."""
    first = rows[0]
    out = {k: v for k, v in first.items() if not isinstance(v, list)}
    for key in ("whole_process_s", "in_process_s", "per_step_overhead_runs_s"):
        out[key] = [x for r in rows for x in r[key]]
    out["breakdown_s"] = {k: [x for r in rows for x in r["breakdown_s"].get(k, [])]
                          for k in first["breakdown_s"]}
    out["repeats"] = len(out["whole_process_s"])
    out["whole_process_median_s"] = median(out["whole_process_s"])
    out["in_process_median_s"] = median(out["in_process_s"])
    out["per_step_overhead_s"] = median(out["per_step_overhead_runs_s"])
    for key in ("storage_bytes", "storage_bytes_at_crash", "fsync_4k_median_s", "bare_step_s"):
        out[f"{key}_runs"] = [r[key] for r in rows]
        out[key] = median(out[f"{key}_runs"])
    out["final_results"] = [r["final_result"] for r in rows]
    wrong = [r for r in out["final_results"] if r != first["final_result"]]
    out["final_result"] = wrong[0] if wrong else first["final_result"]
    out["effect_executions"] = sum(r["effect_executions"] for r in rows)
    out["duplicate_effects"] = sum(r["duplicate_effects"] for r in rows)
    return out


def peers(profile: dict[str, Any], work: pathlib.Path, log: Any) -> list[dict[str, Any]]:
    """Recovery of every system measured alike: tcc (``peers/tcc_peer.py``) and each
    installed peer run the same crash / recover / complete children (``peers/_harness.py``:
    a fresh process each, the same t0 just before the store is opened, imports and start-up
    broken out, a new crashed store in every repetition, storage as allocated blocks).  In
    every round each system runs once, in a shuffled order.  Each of the profile's
    ``conditions`` is measured: ``warm`` (the page cache as the crash left it), ``cold``
    (dropped before the recovery) and ``reboot`` (cold, and tcc's verdict file gone, as a
    new boot id makes it: its open walks the store)."""
    rows: list[dict[str, Any]] = []
    try:
        from benchmarks.peers import tcc_peer
    except ImportError:
        log("peers: benchmarks.peers is missing; skipped")
        return rows
    others = installed_peers(log)
    if not others:
        return rows
    systems = [("tcc", tcc_peer), *others]
    cases = [(n, "const", 0.0, "warm") for n in profile["peer_sizes"]]
    cases += [(n, "const", WORK_MS, "warm") for n in profile["peer_sizes"]]
    for condition in profile.get("conditions", ["warm"]):
        why = condition_unavailable(condition)
        if why is not None:
            log(f"peers: recovery with a {condition} cache not measured: {why}")
        elif condition != "warm":
            cases += [(n, "const", 0.0, condition) for n in profile["peer_sizes"]]
    for n, regime, work_ms, condition in cases:
        label = "work" if work_ms else "const"
        got: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in systems}
        for rep in range(profile["repeats"]):
            for name, mod in shuffled(systems):
                folder = work / f"{name}-{n}-{label}-{condition}-{rep}"
                folder.mkdir(parents=True, exist_ok=True)
                got[name].append(mod.measure(n, regime=regime, work_ms=work_ms, repeats=1, workdir=folder,
                                             work_iters=work_iters() if work_ms else 0,
                                             before_recover=CONDITIONS[condition]))
                shutil.rmtree(folder, ignore_errors=True)
        for name, _ in systems:
            row = merge_repeats(got[name])
            row["regime_label"] = label
            row["condition"] = condition
            rows.append(row)
            log(f"peer {row['peer']:10} N={n:<6} {label:5} {condition:6} in-process "
                f"{median(row['in_process_s']) * 1e3:9.2f} ms  whole {median(row['whole_process_s']) * 1e3:8.1f} ms")
    return rows


# -------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group()
    for name in PROFILES:
        group.add_argument(f"--{name}", dest="profile", action="store_const", const=name)
    parser.add_argument("--no-peers", action="store_true", help="skip DBOS and LangGraph")
    parser.add_argument("--no-render", action="store_true", help="write raw JSON only")
    parser.add_argument("--out", type=pathlib.Path, default=None,
                        help="render tables and figures into DIR (default: paper/generated/ and "
                             "benchmarks/README.md for --full, benchmarks/results/NAME/ otherwise)")
    parser.add_argument("--seed", type=int, default=None,
                        help="seed of the shuffled order within rounds (default: a new one, recorded)")
    args = parser.parse_args(argv)
    profile_name = args.profile or "quick"
    profile = PROFILES[profile_name]
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "big")
    ORDER.seed(seed)
    RESULTS.mkdir(parents=True, exist_ok=True)
    compile_bytecode()

    def log(msg: str) -> None:
        print(msg, flush=True)

    from benchmarks import provenance

    started = time.time()
    with tempfile.TemporaryDirectory(prefix="tcc-bench-") as tmp:
        work = pathlib.Path(tmp)
        raw: dict[str, Any] = {
            "profile": profile_name, "python": platform.python_version(), "machine": platform.machine(),
            "cpus": os.cpu_count(), "started": started, "work_ms": WORK_MS, "hybrid_k": HYBRID_K,
            "order_seed": seed, "provenance": provenance.begin(work),
            "work_iters": work_iters(),
        }
        # each section's wall time, so that the hour the --full protocol may take can be
        # planned from the raw files (which section to trim when a run overruns)
        sections: dict[str, float] = {}
        raw["section_s"] = sections

        def section(name: str, run: Any) -> Any:
            t0 = time.monotonic()
            try:
                return run()
            finally:
                sections[name] = round(time.monotonic() - t0, 1)
                log(f"section {name}: {sections[name]:.0f} s")

        raw["recovery"] = section("recovery", lambda: recovery_suite(profile, work, log))
        raw["checkpoint"] = section("checkpoint", lambda: checkpoint_overhead(profile, work, log))
        raw["steady"] = section("steady", lambda: steady_state(profile, work, log))
        raw["young_daly"] = section("young_daly",
                                    lambda: young_daly(profile, work, raw["checkpoint"], log))
        raw["peers"] = [] if args.no_peers else section("peers", lambda: peers(profile, work, log))
        raw["step_costs"] = [] if args.no_peers else section(
            "step_costs", lambda: step_costs(profile, work, log))
        if not args.no_peers and "postgres" in profile:
            try:  # last, and guarded whole: nothing in it may lose the hour measured before
                raw["postgres"] = section("postgres", lambda: postgres_section(profile, work, log))
            except Exception as exc:  # noqa: BLE001
                log(f"postgres: the section failed:\n{traceback.format_exc()}")
                raw["postgres"] = {"not_run": f"the PostgreSQL section failed: {exc!r}"}
    raw["elapsed_s"] = time.time() - started
    provenance.end(raw["provenance"])
    problems = check(raw)
    out = RESULTS / f"recovery-{profile_name}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(raw, indent=1, default=str))
    log(f"raw results: {out} ({raw['elapsed_s']:.0f} s)")
    if not args.no_render:
        from benchmarks import report
        from benchmarks.paper import PaperError

        publish = args.out is None and profile_name == "full"
        try:
            report.render(raw, log, out=args.out or (None if publish else out.with_suffix("")),
                          readme=publish, source=out)
        except PaperError as exc:  # the tables are written; a sentence of the paper is not true
            problems.append(f"paper/tcc.md not rendered: {exc}")
    for p in problems:
        log(f"PROBLEM: {p}")
    return 1 if problems else 0


def check(raw: dict[str, Any]) -> list[str]:
    """What the smoke test asserts: numbers from every strategy and peer, equal results."""
    problems = []
    by_case: dict[tuple[str, int], dict[str, Any]] = {}
    for row in raw["recovery"]:
        by_case.setdefault((row["regime"], row["n"]), {})[row["strategy"]] = row["result"]
        if not row["in_process_s"] or not row["whole_process_s"]:
            problems.append(f"no numbers for {row['strategy']} {row['regime']} N={row['n']}")
        if "builds" in row and len(row.get("in_place_whole_s", [])) != row["builds"]:
            problems.append(f"no in-place recovery for {row['strategy']} {row['regime']} N={row['n']}")
    for (regime, n), results in by_case.items():
        if set(results) != set(STRATEGIES):
            problems.append(f"missing strategies for {regime} N={n}: {sorted(results)}")
        if len({json.dumps(r, sort_keys=True) for r in results.values()}) != 1:
            problems.append(f"strategies disagree for {regime} N={n}: {results}")
    from benchmarks.peers._agent import expected_result

    for row in raw["recovery"]:
        if row["result"] != expected_result(row["n"]):
            problems.append(f"{row['strategy']} {row['regime']} N={row['n']} returned {row['result']}")
    for row in raw.get("steady", []):
        if not row["step_s"] or not all(x > 0 for x in row["step_s"]):
            problems.append(f"no steady-state numbers for {row['kind']} N={row['n']} {row['strategy']}")
    for row in raw.get("step_costs", []):
        if not row["mean_step_s"] or not all(x > 0 for x in row["mean_step_s"]):
            problems.append(f"no step costs for {row['system']} at N={row['n']}")
    pg = raw.get("postgres") or {}
    problems += [f"postgres: {p}" for p in pg.get("problems", [])]
    if "not_run" in pg:
        problems.append(f"postgres: {pg['not_run']}")
    for row in raw["peers"]:
        if not row.get("in_process_s") or not row.get("whole_process_s"):
            problems.append(f"peer {row.get('peer')} produced no numbers at N={row.get('n')}")
        elif "final_result" in row and row["final_result"] != expected_result(row["n"]):
            problems.append(f"peer {row.get('peer')} N={row['n']} returned {row['final_result']}")
        if row.get("duplicate_effects"):
            problems.append(f"peer {row.get('peer')} N={row['n']} ran {row['duplicate_effects']} "
                            "completed step(s) again")
    return problems


if __name__ == "__main__":
    sys.exit(main())
