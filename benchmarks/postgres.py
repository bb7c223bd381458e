"""tcc, DBOS and LangGraph side by side on ONE PostgreSQL server, against its commit floor.

    python -m benchmarks.postgres --smoke    # N = 10: seconds, a CI smoke test
    python -m benchmarks.postgres --quick    # N = 100, 1,000 (minutes: DBOS re-runs every step)
    python -m benchmarks.postgres --full     # N = 1,000, 10,000
    ... --dsn postgresql://USER@HOST:PORT/postgres   # an existing server instead of a temporary one

Without ``--dsn`` a throw-away cluster is started (``tcc.testing.postgres.TemporaryServer``,
fsync on, synchronous_commit on); with it, every database is created and dropped on that
server (the URL's user must be allowed to CREATE DATABASE).  What is measured, in one run:

1. **the floor**: a bare single-row ``INSERT`` + ``COMMIT`` with psycopg 3, median per op, in
   blocks taken before every repetition round (their spread is a contention gauge);
2. **tcc on its PostgreSQL store** (``benchmarks/agent/agent.py``, its fake LLM, continuation
   strategy): per-step overhead, and recovery after a SIGKILL at the start of step N-1,
   in-process (open store -> first new effect, in a fresh child as the peers') and whole
   process (``tcc resume`` spawned -> first new effect) (``peers/pg_tcc.py``);
3. **DBOS** with ``system_database_url=postgresql://...`` and 4. **LangGraph** with
   ``PostgresSaver`` (durability="sync"): the same agent and measurements as
   ``peers/dbos_peer.py`` / ``peers/langgraph_peer.py`` on SQLite (``peers/pg_peers.py``).

Repetitions are interleaved, the systems in a new random order each round (floor, tcc, DBOS,
LangGraph, floor, LangGraph, tcc, ...; ``--seed``, recorded); every crash run
gets a fresh database.  Regime ``const`` has no work between steps, ``work`` 0.5 ms of CPU
(one calibration shared by all).  Writes raw JSON (and the markdown table) to
``benchmarks/results/pg-PROFILE-TIME.{json,md}``.  Nothing about speed is asserted: the exit
status says only whether every system produced numbers and returned the expected result.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import platform
import random
import statistics
import sys
import tempfile
import time
import traceback
from typing import Any, Callable

from benchmarks import provenance
from benchmarks.peers import _agent, _harness, pg_peers, pg_server, pg_tcc
from benchmarks.recovery import WORK_MS, compile_bytecode, work_iters

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"

PROFILES: dict[str, dict[str, Any]] = {
    "smoke": {"sizes": [10], "repeats": 2, "regimes": ["const"], "floor_block": 200},
    "quick": {"sizes": [100, 1000], "repeats": 3, "regimes": ["const", "work"], "floor_block": 500},
    "full": {"sizes": [1000, 10000], "repeats": 3, "regimes": ["const", "work"], "floor_block": 500},
}
SYSTEMS = ("tcc", "dbos", "langgraph")


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def spread(xs: list[float]) -> float:
    return (max(xs) - min(xs)) / 2 if xs else float("nan")


# ---------------------------------------------------------------------- run


def make_case(system: str, srv: pg_server.Server, **kw: Any) -> Any:
    if system == "tcc":
        return pg_tcc.TccCase(srv, **kw)
    return pg_peers.PeerCase(system, srv, **kw)


def installed_systems(names: list[str], log: Any) -> tuple[list[str], dict[str, str]]:
    """The systems of ``names`` that can run here, and why each other one cannot."""
    systems: list[str] = []
    skipped: dict[str, str] = {}
    for name in names:
        if name == "tcc":
            ok, why = pg_tcc.available()
        else:
            ok, why = pg_peers.available(name), f"{name} or its PostgreSQL saver is not installed"
        if ok:
            systems.append(name)
        else:
            skipped[name] = why
            log(f"{name}: {why}; no numbers")
    return systems, skipped


def run(profile: dict[str, Any], systems: list[str], srv: pg_server.Server, work: pathlib.Path,
        log: Any, order: Callable[[list[str]], list[str]] | None = None) -> dict[str, Any]:
    """Every system at every (regime, N) of ``profile``, one repetition of each per round
    after a block of the floor, in ``order(systems)`` (default: a new random order per round)."""
    shuffle = order or (lambda names: random.sample(names, len(names)))
    raw: dict[str, Any] = {"server_settings": srv.settings(), "server_origin": srv.origin,
                           "server_url": pg_server.redact(srv.base_url)}
    s = raw["server_settings"]
    log(f"PostgreSQL {s['server_version']}: fsync={s['fsync']} synchronous_commit={s['synchronous_commit']}"
        f" wal_sync_method={s['wal_sync_method']} full_page_writes={s['full_page_writes']}")
    if s["fsync"] != "on" or s["synchronous_commit"] != "on":
        log("WARNING: this server does not flush every commit; the numbers are not durable ones")
    rows: list[dict[str, Any]] = []
    problems: list[str] = []
    floor = pg_server.Floor(srv)
    fsync_gauge: list[float] = []  # 4 KiB write + fsync in the work directory, per round
    iters_work = work_iters()
    try:
        for label in profile["regimes"]:
            iters = iters_work if label == "work" else 0
            for n in profile["sizes"]:
                bare = _agent.bare_per_step_s(n, "const", iters)
                cases = {name: make_case(name, srv, n=n, label=label, iters=iters, bare_s=bare, workdir=work)
                         for name in systems}
                for r in range(profile["repeats"]):
                    floor_ms = floor.sample(profile["floor_block"]) * 1e3
                    fsync_gauge.append(_harness.fsync_4k_median_s(work))
                    line = [f"{label:5} N={n:<6} r{r} floor {floor_ms:.3f} ms (fsync 4k {fsync_gauge[-1] * 1e3:.3f})"]
                    for name in shuffle(list(cases)):  # interleaved: floor A C B, floor B A C ...
                        try:
                            cases[name].round(r)
                        except Exception as exc:  # one system failing must not lose the others' numbers
                            problems.append(f"{name} {label} N={n} round {r}: {exc}")
                            log(f"PROBLEM: {name} {label} N={n} round {r}:\n{traceback.format_exc()}")
                            del cases[name]
                            continue
                        smp = cases[name].samples
                        line.append(f"{name} step {smp['per_step_s'][-1] * 1e3:.2f} / in {smp['in_process_s'][-1] * 1e3:.1f}"
                                    f" / whole {smp['whole_process_s'][-1] * 1e3:.0f} ms")
                    log(" | ".join(line))
                for name, case in cases.items():
                    try:
                        row = case.finish()
                    except Exception as exc:
                        problems.append(f"{name} {label} N={n} finish: {exc}")
                        log(f"PROBLEM: {name} {label} N={n} finish:\n{traceback.format_exc()}")
                        continue
                    rows.append(row)
                for name in systems:
                    if not any(r["system"] == name and r["n"] == n and r["regime"] == label for r in rows):
                        rows.append({"system": name, "n": n, "regime": label, "missing": True})
        floor.sample_autocommit(profile["floor_block"])
    finally:
        floor.close()
    raw["floor"] = {
        "what": "psycopg 3: INSERT INTO floor (v) VALUES (%s); COMMIT -- one row, one transaction",
        "median_s": median(floor.samples), "p10_s": _quantile(floor.samples, 0.1),
        "p90_s": _quantile(floor.samples, 0.9), "block_medians_s": floor.blocks,
        "iterations": len(floor.samples),
        "autocommit_median_s": median(floor.autocommit_samples),
        "autocommit_what": "the same INSERT as one autocommit statement (no BEGIN round trip)",
        "fsync_4k_round_medians_s": fsync_gauge,
    }
    raw["rows"] = rows
    raw["problems"] = problems
    return raw


def _quantile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    ys = sorted(xs)
    return ys[min(len(ys) - 1, int(q * len(ys)))]


# ------------------------------------------------------------------- report


def _ms(xs: list[float]) -> str:
    return f"{median(xs) * 1e3:,.2f} ± {spread(xs) * 1e3:,.2f}"


def render(raw: dict[str, Any]) -> str:
    s, fl = raw["server_settings"], raw["floor"]
    floor_s = fl["median_s"]
    out = [
        f"Profile `{raw['profile']}`, Python {raw['python']}, {raw['cpus']} CPUs, {raw['elapsed_s']:.0f} s;"
        f" {provenance.describe(raw.get('provenance'))};"
        f" PostgreSQL {s['server_version']} ({raw['server_origin']} server), fsync={s['fsync']},"
        f" synchronous_commit={s['synchronous_commit']}, wal_sync_method={s['wal_sync_method']}.",
        "",
        f"Floor: single-row `INSERT` + `COMMIT` (psycopg 3) **{floor_s * 1e3:.3f} ms** median of"
        f" {fl['iterations']:,} (p10 {fl['p10_s'] * 1e3:.3f}, p90 {fl['p90_s'] * 1e3:.3f}; block medians"
        f" {min(fl['block_medians_s']) * 1e3:.3f}-{max(fl['block_medians_s']) * 1e3:.3f});"
        f" as one autocommit statement {fl['autocommit_median_s'] * 1e3:.3f} ms. A 4 KiB write + fsync"
        f" (contention gauge, per round) {median(fl['fsync_4k_round_medians_s']) * 1e3:.3f} ms"
        f" ({min(fl['fsync_4k_round_medians_s'], default=0) * 1e3:.3f}-"
        f"{max(fl['fsync_4k_round_medians_s'], default=0) * 1e3:.3f}).",
        "",
        "Medians ± half-range over interleaved repetitions; per-step overhead = time per step"
        " in the crash run minus the bare loop's; ratios against the floor and against tcc in"
        " the same session.",
        "",
        "| system | regime | N | per-step overhead (ms) | / floor | in-process (ms) | whole process (ms) |"
        " in-process / tcc | whole / tcc | stored after N (bytes) | result |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    rows = raw["rows"]
    tcc = {(r["regime"], r["n"]): r for r in rows if r["system"] == "tcc" and not r.get("missing")}
    for r in rows:
        if r.get("missing"):
            out.append(f"| {r['system']} | {r['regime']} | {r['n']:,} | - | - | - | - | - | - | - | no numbers |")
            continue
        t = tcc.get((r["regime"], r["n"]))

        def ratio(key: str, r: dict[str, Any] = r, t: dict[str, Any] | None = t) -> str:
            return f"{median(r[key]) / median(t[key]):.1f}×" if t and median(t[key]) > 0 else "-"

        ok = r["final_result"] == _agent.expected_result(r["n"])
        dup = r.get("duplicate_effects")
        result = ("ok" if ok else f"WRONG {r['final_result']}") + (f", {dup} dup. effects" if dup else "")
        out.append(
            f"| {r['system']} {r['version']} | {r['regime']} | {r['n']:,} | {_ms(r['per_step_s'])} |"
            f" {median(r['per_step_s']) / floor_s:.1f}× | {_ms(r['in_process_s'])} | {_ms(r['whole_process_s'])} |"
            f" {ratio('in_process_s')} | {ratio('whole_process_s')} | {r['storage_after_n']['tables']:,} | {result} |"
        )
    parts = [r for r in rows if not r.get("missing") and r.get("breakdown_s")]
    if parts:
        out += ["", "Breakdown (medians, ms):", "", "| system | regime | N | parts |", "|---|---|---|---|"]
        for r in parts:
            cells = ", ".join(f"{k} {median(v) * 1e3:,.1f}" for k, v in r["breakdown_s"].items() if v)
            out.append(f"| {r['system']} | {r['regime']} | {r['n']:,} | {cells} |")
    if raw["problems"]:
        out += ["", "Problems:", ""] + [f"- {p}" for p in raw["problems"]]
    return "\n".join(out)


def check(raw: dict[str, Any], systems: list[str]) -> list[str]:
    """Numbers from every system at every size, and the expected result from each."""
    problems = list(raw["problems"])
    if not raw["floor"]["block_medians_s"]:
        problems.append("no floor numbers")
    for r in raw["rows"]:
        where = f"{r['system']} {r['regime']} N={r['n']}"
        if r.get("missing"):
            problems.append(f"{where}: no numbers")
            continue
        if not r["per_step_s"] or not r["in_process_s"] or not r["whole_process_s"]:
            problems.append(f"{where}: incomplete numbers")
        if r["final_result"] != _agent.expected_result(r["n"]):
            problems.append(f"{where} returned {r['final_result']}, not {_agent.expected_result(r['n'])}")
    return sorted(set(problems), key=problems.index)


# --------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group()
    for name in PROFILES:
        group.add_argument(f"--{name}", dest="profile", action="store_const", const=name)
    parser.add_argument("--dsn", help="postgresql://USER@HOST:PORT/DB of an existing server (databases are"
                        " created and dropped there) instead of a temporary one")
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    parser.add_argument("--sizes", type=int, nargs="+", help="override the profile's N list")
    parser.add_argument("--repeats", type=int, help="override the profile's repetitions")
    parser.add_argument("--regimes", nargs="+", choices=["const", "work"], help="override the profile's regimes")
    parser.add_argument("--seed", type=int, default=None,
                        help="seed of the shuffled order within rounds (default: a new one, recorded)")
    args = parser.parse_args(argv)
    profile_name = args.profile or "quick"
    profile = dict(PROFILES[profile_name])
    for key in ("sizes", "repeats", "regimes"):
        if getattr(args, key):
            profile[key] = getattr(args, key)

    def log(msg: str) -> None:
        print(msg, flush=True)

    systems, skipped = installed_systems(args.systems, log)
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "big")
    order = random.Random(seed)
    started = time.time()
    RESULTS.mkdir(parents=True, exist_ok=True)
    compile_bytecode()
    with tempfile.TemporaryDirectory(prefix="tcc-pg-bench-") as tmp, pg_server.server(args.dsn, log) as srv:
        work = pathlib.Path(tmp)
        os.chmod(work, 0o700)
        origin = provenance.begin(work)
        raw = run(profile, systems, srv, work, log, lambda names: order.sample(names, len(names)))
    raw.update(order_seed=seed, provenance=provenance.end(origin), profile=profile_name, profile_settings=profile, python=platform.python_version(),
               machine=platform.machine(), cpus=os.cpu_count(), started=started, work_ms=WORK_MS,
               work_iters=work_iters(), systems=systems, skipped=skipped, elapsed_s=time.time() - started)
    for name, why in skipped.items():
        for label in profile["regimes"]:
            for n in profile["sizes"]:
                raw["rows"].append({"system": name, "n": n, "regime": label, "missing": True, "why": why})
    problems = check(raw, args.systems)
    raw["problems"] = problems
    return _harness.write_results(RESULTS, f"pg-{profile_name}", raw, render, log)


if __name__ == "__main__":
    sys.exit(main())
