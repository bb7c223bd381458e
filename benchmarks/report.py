"""Render the recovery harness's raw JSON into tables and figures.

    python -m benchmarks.report benchmarks/results/recovery-full-....json [--out DIR]

Writes ``results.md`` (every table of the paper) and ``*.png`` (figures, when
matplotlib is installed) into ``paper/generated/`` for a ``full`` run, else into
``benchmarks/results/<raw file's name>/`` (``--out`` chooses), and, for a ``full``
run rendered into the paper, the summary table between the markers in
``benchmarks/README.md`` and the paper, ``paper/tcc.md``, from its template
``paper/tcc.in.md`` (``benchmarks/paper.py``; the raw file is copied to ``paper/data/``,
where the paper cites it).  Every number is a median over interleaved repetitions,
with its spread (max-min)/2, and a ratio against the continuation strategy measured
in the same session; the header names the commit, kernel, file system, fsync cost and
load the raw file recorded (``benchmarks/provenance.py``).
"""

from __future__ import annotations

import argparse
import functools
import json
import pathlib
import random
import statistics
import sys
from typing import Any, Callable

ROOT = pathlib.Path(__file__).resolve().parent.parent
GENERATED = ROOT / "paper" / "generated"
BENCH_README = ROOT / "benchmarks" / "README.md"
BEGIN, END = "<!-- BEGIN GENERATED -->", "<!-- END GENERATED -->"


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def spread(xs: list[float]) -> float:
    return (max(xs) - min(xs)) / 2 if xs else float("nan")


def ms(x: float) -> str:
    return f"{x * 1e3:,.2f}"


def count(x: float) -> str:
    """A count: bytes, steps, seconds (``6,119,424``)."""
    return f"{x:,.0f}"


def times(x: float, places: int = 2) -> str:
    """A ratio printed without an interval (``1.66×``)."""
    return f"{x:.{places}f}×"


def share(x: float) -> str:
    """A fraction of run time (``0.0054``)."""
    return f"{x:.4f}"


BOOTSTRAP = 2000  # resamples per interval
MIN_FOR_INTERVAL = 5  # fewer repetitions than this get no interval, and no difference is called


def ci95(xs: list[float], seed: int = 0) -> tuple[float, float]:
    """A 95% percentile-bootstrap confidence interval of the median of ``xs`` (seeded, so a
    raw file always renders the same; with few repetitions it is wide, as it should be)."""
    if not xs:
        return float("nan"), float("nan")
    return _ci95(tuple(xs), seed)


def ratio_ci95(xs: list[float], ys: list[float], seed: int = 0) -> tuple[float, float]:
    """A 95% bootstrap interval of median(xs) / median(ys), each resampled on its own."""
    if not xs or not ys:
        return float("nan"), float("nan")
    return _ratio_ci95(tuple(xs), tuple(ys), seed)


# A render asks for the same interval many times (a table cell and the prose's claims about
# it; a claim checked against several runs): seeded, each is a function of its samples, so
# it is computed once.
@functools.lru_cache(maxsize=8192)
def _ci95(xs: tuple[float, ...], seed: int) -> tuple[float, float]:
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(BOOTSTRAP))
    return meds[int(0.025 * BOOTSTRAP)], meds[int(0.975 * BOOTSTRAP) - 1]


@functools.lru_cache(maxsize=8192)
def _ratio_ci95(xs: tuple[float, ...], ys: tuple[float, ...], seed: int) -> tuple[float, float]:
    rng = random.Random(seed)
    ratios = sorted(statistics.median(rng.choices(xs, k=len(xs)))
                    / statistics.median(rng.choices(ys, k=len(ys))) for _ in range(BOOTSTRAP))
    return ratios[int(0.025 * BOOTSTRAP)], ratios[int(0.975 * BOOTSTRAP) - 1]


def ms_ci(xs: list[float]) -> str:
    """``median [low–high]`` in ms: the 95% interval of the median (``n=K`` instead when
    there are too few repetitions for one)."""
    if len(xs) < MIN_FOR_INTERVAL:
        return f"{ms(med(xs))} (n={len(xs)})"
    lo, hi = ci95(xs)
    return f"{ms(med(xs))} [{ms(lo)}–{ms(hi)}]"


def ratio_cell(xs: list[float], ys: list[float]) -> str:
    """median(xs)/median(ys) with its 95% interval; marked ``*`` when the interval excludes
    1 (the two differ at this confidence; otherwise no difference is claimed).  With fewer
    than ``MIN_FOR_INTERVAL`` repetitions on either side: the ratio alone, nothing called."""
    if min(len(xs), len(ys)) < MIN_FOR_INTERVAL:
        return times(med(xs) / med(ys))
    lo, hi = ratio_ci95(xs, ys)
    mark = "*" if hi < 1 or lo > 1 else ""
    return f"{med(xs) / med(ys):.2f}×{mark} [{lo:.2f}–{hi:.2f}]"


def regime_order(regime: str, n: int) -> tuple[int, str, int, int]:
    """History regimes by name, then the state-size cases (``size:B``) by size."""
    if regime.startswith("size:"):
        return (1, "", int(regime.split(":")[1]), n)
    return (0, regime, 0, n)


def regime_label(regime: str) -> str:
    if not regime.startswith("size:"):
        return regime
    size = int(regime.split(":")[1])
    return f"state {size / (1 << 20):g} MiB" if size >= 1 << 20 else f"state {size / 1024:g} KiB"


def recovery_table(raw: dict[str, Any], key: str) -> list[str]:
    lines = [
        f"| regime | N | continuation (ms) | hybrid K={raw['hybrid_k']} (ms) | replay (ms) "
        "| hybrid / cont. | replay / cont. |",
        "|---|---|---|---|---|---|---|",
    ]
    cases: dict[tuple[str, int], dict[str, list[float]]] = {}
    for row in raw["recovery"]:
        cases.setdefault((row["regime"], row["n"]), {})[row["strategy"]] = row.get(key, [])
    for (regime, n), by in sorted(cases.items(), key=lambda kv: regime_order(*kv[0])):
        c, h, r = (by.get(s, []) for s in ("continuation", "hybrid", "replay"))
        lines.append(
            f"| {regime_label(regime)} | {n:,} | {ms_ci(c)} | {ms_ci(h)} | {ms_ci(r)} | {ratio_cell(h, c)} "
            f"| {ratio_cell(r, c)} |"
        )
    return lines


def bare_interpreter_lines(raw: dict[str, Any]) -> list[str]:
    """Whole-process recovery of the continuation strategy as a multiple of ``python -c
    pass``, spawned in the same rounds (older raw files did not measure it)."""
    rows = [r for r in raw["recovery"] if r["strategy"] == "continuation" and r.get("bare_interpreter_s")]
    if not rows:
        return []
    lines = ["Continuation's whole-process recovery against `python -c pass` spawned in the same "
             "rounds:", "", "| regime | N | `python -c pass` (ms) | recovery / `python -c pass` |",
             "|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: regime_order(r["regime"], r["n"])):
        bare = med(r["bare_interpreter_s"])
        lines.append(f"| {regime_label(r['regime'])} | {r['n']:,} | {ms(bare)} | {times(med(r['whole_process_s']) / bare, 1)} |")
    return lines


def in_place_lines(raw: dict[str, Any]) -> list[str]:
    """Whole-process recovery of each crashed store itself, as the crash left it (one per
    build; older raw files timed copies only)."""
    if not any(r.get("in_place_whole_s") for r in raw["recovery"]):
        return []
    builds = max(r.get("builds", 1) for r in raw["recovery"])
    return ["## Recovery in place, whole process (the store the crash left, no copy)", "",
            f"One recovery per crashed store; {builds} stores built per case (the tables above "
            "recover fresh copies of them in turn).", "", *recovery_table(raw, "in_place_whole_s"), ""]


def peer_reference(raw: dict[str, Any]) -> tuple[bool, dict[tuple[str, int, str], dict[str, Any]]]:
    """The tcc row each peer row is divided by, by (regime, N, cache), and whether it was
    measured as a peer (newer raw files) rather than taken from the harness's own rows."""
    ref: dict[tuple[str, int, str], dict[str, Any]] = {}
    fair = any(row["peer"] == "tcc" for row in raw["peers"])
    if fair:
        for row in raw["peers"]:
            if row["peer"] == "tcc":
                ref[(row.get("regime_label", row["regime"]), row["n"], row.get("condition", "warm"))] = row
    else:
        for row in raw["recovery"]:
            if row["strategy"] == "continuation":
                ref[(row["regime"], row["n"], "warm")] = row
    return fair, ref


def peer_table(raw: dict[str, Any]) -> list[str]:
    """Recovery of every system in the same children (newer raw files: tcc is a peer row,
    measured exactly as the others); older raw files compare against the harness's own
    in-process tcc numbers, which the table then says."""
    if not raw.get("peers"):
        return ["(no peers installed in this run)"]
    fair, ref = peer_reference(raw)
    lines = [
        "| system | regime | cache | N | in-process (ms) | whole process (ms) | of which imports (ms) "
        "| in-process / tcc | whole / tcc | per-step overhead (ms) | storage at the crash (bytes) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    polls = []
    for row in raw["peers"]:
        regime, n, cache = row.get("regime_label", row["regime"]), row["n"], row.get("condition", "warm")
        base = ref.get((regime, n, cache), {})
        pi, pw = row["in_process_s"], row["whole_process_s"]
        imports = row.get("breakdown_s", {}).get("imports_s", [])
        ratio_i = ratio_cell(pi, base["in_process_s"]) if base else "—"
        ratio_w = ratio_cell(pw, base["whole_process_s"]) if base else "—"
        lines.append(
            f"| {row['peer']} {row.get('version', '')} | {regime} | {cache} | {n:,} | {ms_ci(pi)} | {ms_ci(pw)} "
            f"| {ms(med(imports)) if imports else '—'} | {ratio_i} | {ratio_w} "
            f"| {row.get('per_step_overhead_s', float('nan')) * 1e3:.2f} "
            f"| {count(int(row.get('storage_bytes_at_crash', row.get('storage_bytes', 0))))} |"
        )
        excl = row.get("breakdown_s", {}).get("in_process_excl_poll_s")
        if excl:
            polls.append(f"{row['peer']} {regime} {cache} N={n:,}: {ms_ci(excl)} ms without its queue poll "
                         f"(the poll wait: {ms(med(row['breakdown_s']['queue_poll_wait_s']))} ms)")
    if fair:
        lines += ["", "Every system, tcc included, is measured by the same driver: a fresh process per "
                  "crash, recovery and completion, t0 just before its store is opened (imports and the "
                  "agent's code before it), a new crashed store in every repetition, storage as "
                  "allocated blocks at the crash point. Retention differs by design: tcc keeps its "
                  "newest 3 snapshots, LangGraph every checkpoint, DBOS every step's output. Cache: "
                  "`warm`, as the crash left it; `cold`, the page cache dropped before the recovery "
                  "process starts (its interpreter, libraries and store come from disk); `reboot`, "
                  "cold and tcc's verdict file gone, as a new boot id makes it (its open walks "
                  "data.mdb)."]
    else:
        lines += ["", "(An older raw file: tcc's numbers here are the harness's in-process ones, timed in "
                  "a warmer process than the peers'.)"]
    if polls:
        lines += ["", "In-process recovery without DBOS's queue poll interval:", ""] + [f"- {p}" for p in polls]
    return lines


def postgres_table(raw: dict[str, Any]) -> list[str]:
    """The PostgreSQL section (``recovery.postgres_section``): every system on one server,
    each against tcc and the bare INSERT + COMMIT floor; nothing when the run has none."""
    pg = raw.get("postgres")
    if not pg:
        return []
    if "not_run" in pg:
        return [f"(not measured in this run: {pg['not_run']})"]
    s, floor = pg["server_settings"], pg["floor"]
    floor_s = floor["median_s"]
    lines = [
        f"PostgreSQL {s['server_version']} ({pg['server_origin']} server on this machine), "
        f"fsync={s['fsync']}, synchronous_commit={s['synchronous_commit']}, "
        f"wal_sync_method={s['wal_sync_method']}. Floor: a single-row `INSERT` + `COMMIT` "
        f"(psycopg 3) {floor_s * 1e3:.3f} ms median of {floor['iterations']:,}. Each "
        "repetition is a crash run (SIGKILL at the start of step N-1) in a new database, "
        "in-process recovery in a fresh child for every system (t0 just before its store is "
        "opened) and whole-process recovery spawned; per-step overhead is the crash run's mean "
        "step minus the bare loop's.",
        "",
        "| system | regime | N | per-step overhead (ms) | / floor | step / tcc | in-process (ms) "
        "| in-process / tcc | whole process (ms) | whole / tcc | stored after N (bytes) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    rows = [r for r in pg["rows"] if not r.get("missing")]
    tcc = {(r["regime"], r["n"]): r for r in rows if r["system"] == "tcc"}
    polls = []
    for r in sorted(rows, key=lambda r: (r["regime"], r["n"], r["system"] != "tcc", r["system"])):
        t = tcc.get((r["regime"], r["n"]))

        def vs(key: str, r: dict[str, Any] = r, t: dict[str, Any] | None = t) -> str:
            return "—" if t is None or r is t else ratio_cell(r[key], t[key])

        lines.append(
            f"| {r['system']} {r.get('version', '')} | {r['regime']} | {r['n']:,} | {ms_ci(r['per_step_s'])} "
            f"| {times(med(r['per_step_s']) / floor_s, 1)} | {vs('per_step_s')} | {ms_ci(r['in_process_s'])} "
            f"| {vs('in_process_s')} | {ms_ci(r['whole_process_s'])} | {vs('whole_process_s')} "
            f"| {count(r['storage_after_n']['tables'])} |")
        excl = r.get("breakdown_s", {}).get("in_process_excl_poll_s")
        if excl:
            polls.append(f"{r['system']} {r['regime']} N={r['n']:,}: {ms_ci(excl)} ms without its queue poll "
                         f"(the poll wait: {ms(med(r['breakdown_s']['queue_poll_wait_s']))} ms)")
    for r in pg["rows"]:
        if r.get("missing"):
            lines.append(f"| {r['system']} | {r['regime']} | {r['n']:,} | not measured: "
                         f"{r.get('why', 'it failed (see problems)')} | | | | | | | |")
    if polls:
        lines += ["", "In-process recovery without DBOS's queue poll interval:", ""] + [f"- {p}" for p in polls]
    if pg.get("problems"):
        lines += ["", "Problems:", ""] + [f"- {p}" for p in pg["problems"]]
    return lines


def checkpoint_table(raw: dict[str, Any]) -> list[str]:
    lines = [
        "| state | snapshot bytes | step, snapshot each effect (ms) | step, journal only (ms) "
        "| checkpoint overhead (ms) | raw LMDB floor (ms) | overhead / floor |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in raw["checkpoint"]:
        lines.append(
            f"| {count(row['state_bytes'])} B | {count(row['snapshot_bytes'])} | {ms(med(row['step_s_continuation']))} "
            f"| {ms(med(row['step_s_journal_only']))} | {ms(row['checkpoint_overhead_s'])} "
            f"| {ms(row['raw_lmdb_commit_s'])} | {times(row['ratio_vs_raw'])} |"
        )
    marginal = any("raw_commit_with_s" in row for row in raw["checkpoint"])
    return lines + ["", "The agent rewrites one 128-byte element of its state per step. Overhead: the "
                    "median step with a snapshot after every effect minus the median journal-only step. "
                    + ("Floor: the marginal cost of the same snapshot bytes in a raw synced LMDB commit "
                       "(a journal-sized record with them, minus the same commit without them)."
                       if marginal else "Floor: a separate synced raw LMDB put+commit of the bytes "
                       "(runs before the marginal floor).")]


def steady_table(raw: dict[str, Any]) -> list[str]:
    """Per-step time once a run is long, as ratios measured in the same run (the hot-path
    goals: continuation at the largest N within 1.5x of the smallest N and of replay; an
    unchanged large bytes value within 2x of the same agent without it)."""
    rows = raw.get("steady") or []
    if not rows:
        return ["(not measured in this run)"]
    step = {(r["kind"], r["n"], r["strategy"], r["regime"]): med(r["step_s"]) for r in rows}
    samples = {(r["kind"], r["n"], r["strategy"], r["regime"]): r["step_s"] for r in rows}
    lines = ["| workload | N | continuation (ms/step) | replay, journal only (ms/step) "
             "| continuation / replay | continuation / at the smallest N |",
             "|---|---|---|---|---|---|"]
    for kind, label in (("grow", "grow (+1 message/step)"), ("mutate", "mutate (16 slots, 1 rewritten/step)")):
        sizes = sorted({r["n"] for r in rows if r["kind"] == kind})
        if not sizes:
            continue
        base = samples[(kind, sizes[0], "continuation", kind)]
        for n in sizes:
            c, r = samples[(kind, n, "continuation", kind)], samples[(kind, n, "replay", kind)]
            lines.append(f"| {label} | {n:,} | {ms_ci(c)} | {ms_ci(r)} | {ratio_cell(c, r)} "
                         f"| {ratio_cell(c, base) if n != sizes[0] else '1'} |")
    held = [r for r in rows if r["kind"] == "hold" and r["regime"].startswith("hold:")]
    for row in held:
        plain = step[("hold", row["n"], "continuation", "const")]
        with_it = med(row["step_s"])
        size = int(row["regime"].split(":")[1])
        lines += ["", "| held unchanged `bytes` | N | with it (ms/step) | without it (ms/step) | ratio |",
                  "|---|---|---|---|---|",
                  f"| {count(size / (1 << 20))} MiB | {row['n']:,} | {ms(with_it)} | {ms(plain)} "
                  f"| {times(with_it / plain)} |"]
    return lines


def step_cost_table(raw: dict[str, Any]) -> list[str]:
    """Mean step in each regime, tcc next to the peers (the hot-path goal: tcc continuation
    at most 0.5x each peer at N = 1,000 and 10,000), as ratios in one run."""
    rows = raw.get("step_costs") or []
    if not rows:
        return ["(not measured in this run: the peers are not installed, or --no-peers)"]
    systems = list(dict.fromkeys(r["system"] for r in rows))
    peers = [s for s in systems if not s.startswith("tcc")]
    lines = ["| regime | N | " + " | ".join(f"{s} (ms/step)" for s in systems) + " | "
             + " | ".join(f"continuation / {p}" for p in peers) + " | no framework (µs/step) |",
             "|" + "---|" * (len(systems) + len(peers) + 3)]
    regimes = list(dict.fromkeys(r.get("regime", "grow") for r in rows))
    for regime in regimes:
        for n in sorted({r["n"] for r in rows if r.get("regime", "grow") == regime}):
            at = {r["system"]: r for r in rows if r["n"] == n and r.get("regime", "grow") == regime}
            cells = [ms_ci(at[s]["mean_step_s"]) if s in at else "not measured" for s in systems]
            ratios = [ratio_cell(at["tcc continuation"]["mean_step_s"], at[p]["mean_step_s"]) if p in at
                      else "—" for p in peers]
            lines.append(f"| {regime} | {n:,} | " + " | ".join(cells + ratios)
                         + f" | {at['tcc continuation']['bare_step_s'] * 1e6:.1f} |")
    return lines + ["", "Mean step over the first N − 1 steps, (t_N − t_begin) / (N − 1), t_N taken at the start "
                    "of step N − 1 in each system's crash child (tcc's too), the agent's own work included "
                    "and start-up excluded; one child per system, regime and round runs to the regime's "
                    "largest N and the smaller sizes are read off its way. Regimes: `const` "
                    "(a counter and the last output), `grow` (one chat message, ~1.7 KB of real prose or "
                    "source text, appended per step), `mutate` (a 16-message scratchpad, one slot "
                    "rewritten per step). LangGraph is not run on the growing transcript above "
                    "N = 3,000: it keeps every checkpoint of the whole state (N²/2 messages)."]


def bytes_table(raw: dict[str, Any]) -> list[str]:
    lines = ["| regime | N | continuation B/step | hybrid B/step | replay B/step |", "|---|---|---|---|---|"]
    cases: dict[tuple[str, int], dict[str, float]] = {}
    for row in raw["recovery"]:
        cases.setdefault((row["regime"], row["n"]), {})[row["strategy"]] = row["bytes_per_step"]
    for (regime, n), by in sorted(cases.items(), key=lambda kv: regime_order(*kv[0])):
        lines.append(
            f"| {regime_label(regime)} | {n:,} | {count(by.get('continuation', 0))} | {count(by.get('hybrid', 0))} "
            f"| {count(by.get('replay', 0))} |"
        )
    return lines


def young_daly_table(raw: dict[str, Any]) -> list[str]:
    yd = raw["young_daly"]
    lines = [
        f"Checkpoint cost C = {ms(yd['checkpoint_s'])} ms per snapshot, step time = {ms(yd['step_s'])} ms, "
        f"assumed MTBF = {yd['mtbf_s']:.0f} s: Young-Daly interval "
        f"sqrt(2·C·MTBF) = **{count(yd['k_opt'])} steps**; best measured K = **{yd['best_measured_k']}**.",
        "",
        "| K | step time (ms) | recovery, crash mid-interval (ms) | expected overhead |",
        "|---|---|---|---|",
    ]
    for r in yd["sweep"]:
        lines.append(
            f"| {r['k']} | {ms(r['step_s'])} | {ms(med(r['recovery_s']))} | {share(r['expected_overhead'])} |"
        )
    return lines


def figures(raw: dict[str, Any], log: Callable[[str], None], target: pathlib.Path = GENERATED) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib is not installed: figures skipped (pip install 'tcc[bench]')")
        return []
    made = []
    regimes = sorted({r["regime"] for r in raw["recovery"]})
    fig, axes = plt.subplots(1, len(regimes), figsize=(4.2 * len(regimes), 3.4), squeeze=False)
    for ax, regime in zip(axes[0], regimes):
        for strategy, style in (("continuation", "o-"), ("hybrid", "s--"), ("replay", "^:")):
            pts = sorted((r["n"], med(r["in_process_s"])) for r in raw["recovery"]
                         if r["regime"] == regime and r["strategy"] == strategy)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] * 1e3 for p in pts], style, label=strategy)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"regime: {regime}")
        ax.set_xlabel("history length N (effects)")
        ax.set_ylabel("in-process recovery (ms)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = target / "recovery_vs_n.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    made.append(path.name)

    rows = raw["checkpoint"]
    if rows:
        fig, ax = plt.subplots(figsize=(5, 3.4))
        xs = [r["state_bytes"] for r in rows]
        ax.plot(xs, [r["checkpoint_overhead_s"] * 1e3 for r in rows], "o-", label="tcc checkpoint overhead")
        ax.plot(xs, [r["raw_lmdb_commit_s"] * 1e3 for r in rows], "s--", label="raw LMDB sync commit")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("agent state (bytes)")
        ax.set_ylabel("ms per step")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = target / "checkpoint_overhead.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        made.append(path.name)
    return made


def render(raw: dict[str, Any], log: Callable[[str], None] = print, *,
           out: pathlib.Path | None = None, readme: bool = False, source: pathlib.Path | None = None) -> None:
    """Render ``raw`` into ``out`` (default ``paper/generated/``); ``readme``: also the
    summary between the markers of ``benchmarks/README.md`` (the published numbers) and
    ``paper/tcc.md`` from its template, citing ``source``, the raw file, which it needs.
    Raises ``paper.PaperError`` (after writing the tables) when the template does not
    render: a claim of its prose that the new numbers make false, or an unknown name."""
    from benchmarks.provenance import describe

    if readme and source is None:
        raise ValueError("rendering into the paper needs the raw file (source=) for it to cite")
    target = GENERATED if out is None else out
    target.mkdir(parents=True, exist_ok=True)
    made = figures(raw, log, target)
    order = f" (order seed {raw['order_seed']})" if "order_seed" in raw else ""
    header = (f"Profile `{raw['profile']}`, Python {raw['python']}, {raw['cpus']} CPUs, "
              f"{count(raw['elapsed_s'])} s; {describe(raw.get('provenance'))}. Medians over "
              f"interleaved repetitions{order}: recovery and step-cost tables give the 95% "
              "bootstrap interval of each median [low–high] and of each ratio (`*`: the interval "
              f"excludes 1, so the two differ; without it no difference is claimed) when there are "
              f"at least {MIN_FOR_INTERVAL} repetitions (else `n=K` and no difference is called); "
              "other tables give ± half-range.")
    if raw.get("section_s"):  # raw files from before it was recorded have none
        header += " Wall time by section: " + ", ".join(
            f"{name.replace('_', ' ')} {count(s)} s" for name, s in raw["section_s"].items()) + "."
    parts = [
        "# Generated results", "", header, "",
        "## Recovery latency, in-process (open store → first new effect)", "",
        *recovery_table(raw, "in_process_s"), "",
        "## Recovery latency, whole process (`tcc resume` spawned → first new effect)", "",
        *recovery_table(raw, "whole_process_s"), "",
        *bare_interpreter_lines(raw), "",
        *in_place_lines(raw),
        "## Peers, same agent, same machine, same session", "", *peer_table(raw), "",
        "## Checkpoint overhead per step vs state size", "", *checkpoint_table(raw), "",
        "## Steady-state step (median of the last 100 steps of a run)", "", *steady_table(raw), "",
        "## Step cost per regime, tcc next to the peers", "", *step_cost_table(raw), "",
        *(["## On one PostgreSQL server: tcc, DBOS and LangGraph on their production stores", "",
           *postgres_table(raw), ""] if raw.get("postgres") else []),
        "## Store bytes per step (allocated store size / steps run)", "", *bytes_table(raw), "",
        "## Young-Daly interval vs measured hybrid K", "", *young_daly_table(raw), "",
    ]
    for name in made:
        parts += [f"![{name}]({name})", ""]
    (target / "results.md").write_text("\n".join(parts))
    if not readme:
        log(f"rendered {target / 'results.md'}")
        return
    summary = [BEGIN, "", header, "", "In-process recovery:", "", *recovery_table(raw, "in_process_s"), "",
               "Steady-state step:", "", *steady_table(raw), "",
               "Step cost per regime, next to the peers:", "", *step_cost_table(raw), "",
               "Peers:", "", *peer_table(raw), "",
               *(["On one PostgreSQL server:", "", *postgres_table(raw), ""] if raw.get("postgres") else []),
               END]
    text = BENCH_README.read_text() if BENCH_README.exists() else f"# Benchmarks\n\n{BEGIN}\n{END}\n"
    if BEGIN in text and END in text:
        text = text[: text.index(BEGIN)] + "\n".join(summary) + text[text.index(END) + len(END):]
    BENCH_README.write_text(text)
    log(f"rendered {target / 'results.md'} and {BENCH_README}")
    from benchmarks import paper

    assert source is not None
    paper.publish(raw, source, log)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Render a recovery benchmark's raw JSON.")
    parser.add_argument("raw", type=pathlib.Path, help="a benchmarks/results/recovery-*.json file")
    parser.add_argument("--out", type=pathlib.Path, default=None,
                        help="where to write (default: paper/generated/, benchmarks/README.md and "
                             "paper/tcc.md for a full run, else a folder named after the raw file)")
    args = parser.parse_args(argv)
    raw = json.loads(args.raw.read_text())
    publish = args.out is None and raw.get("profile") == "full"
    from benchmarks.paper import PaperError

    try:
        render(raw, out=args.out or (None if publish else args.raw.with_suffix("")), readme=publish,
               source=args.raw)
    except PaperError as exc:
        print(f"paper/tcc.md not rendered: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
