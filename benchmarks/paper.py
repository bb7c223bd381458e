"""Render the paper from its template: every figure of ``paper/tcc.md`` that the raw file
holds is filled in from it, printed by the helpers that print the tables.

    python -m benchmarks.report paper/data/recovery-full-....json

renders ``paper/generated/``, then ``paper/tcc.md`` from ``paper/tcc.in.md`` (for a ``full``
raw file rendered into the paper only: ``report.render``).  Edit the template, not
``tcc.md``.  The template is Markdown with three kinds of placeholder:

``{{ name }}``
    a value of ``values()``, as ``generated/results.md`` prints it: ``{{ in.const.10.cont }}``
    is continuation's median in-process recovery in ``const`` at N = 10, ``8.45``, and
    ``{{ in.const.10.cont.ci }}`` its interval, ``[7.34–10.35]``.
``{{ check: name }}``
    a claim of ``CLAIMS``, rendering to nothing.  Rendering fails, naming the claim and the
    figures it looked at, unless the claim holds in the raw file: one follows every sentence
    whose wording depends on the data ("met", "faster", "in every regime"), so a run that
    makes the sentence false stops the render instead of publishing it.  A claim of
    ``ACROSS_RUNS`` ("the runs disagree") is judged once, over the raw file and every
    ``also:`` run together.
``{{ also: FILE }}``
    another full run, a raw file committed in ``paper/data/``, rendering to its name: every
    claim of the template must hold in it too, not only in the run the figures come from
    (except ``ABOUT_THE_RUN``, claims about the rendered run itself).  Absolute times on a
    shared machine move between runs by more than a run's own intervals (two quiet full
    runs seven commits and hours apart differed up to 2x, the machine itself slower the
    second time), so a claim checked against one run's intervals can read differently
    after a re-run; naming earlier runs here makes the paper say only what each shows.

An unknown name fails the render too.  Nothing in a template is evaluated.
"""

from __future__ import annotations

import functools
import json
import math
import pathlib
import re
from typing import Any, Callable

from benchmarks import provenance
from benchmarks.report import (
    MIN_FOR_INTERVAL, count, med, ms, ms_ci, peer_reference, ratio_cell, ratio_ci95, regime_label,
    share, times,
)

ROOT = pathlib.Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "paper" / "tcc.in.md"
PAPER = ROOT / "paper" / "tcc.md"
DATA = ROOT / "paper" / "data"
BANNER = ("<!-- Rendered from tcc.in.md by `python -m benchmarks.report RAW.json` "
          "(benchmarks/paper.py): edit that file, not this one. -->\n")

Value = Callable[[], str]
Verdict = tuple[bool, str]  # whether a claim holds, and the figures it looked at

_PLACEHOLDER = re.compile(r"\{\{(.*?)\}\}", re.S)
_INSIDE = re.compile(r"\s*(check:\s*|also:\s*)?([A-Za-z0-9_./-]+)\s*")
_STRATEGIES = {"continuation": "cont", "hybrid": "hybrid", "replay": "replay"}


class PaperError(Exception):
    """The template cannot be rendered from this raw file (the message says where and why)."""


# -------------------------------------------------------------------- values


def _regime(regime: str) -> str:
    """A regime as names spell it: ``const``, or a state size as ``1KiB`` … ``10MiB``."""
    return regime_label(regime).removeprefix("state ").replace(" ", "")


def _cell(v: dict[str, Value], name: str, cell: Callable[[], str]) -> None:
    """``name``: a table cell's figure; ``name.ci``: what follows it in the cell (the
    interval ``[low–high]``, ``(n=K)`` with too few repetitions, or nothing)."""
    once = functools.cache(cell)
    v[name] = lambda: once().partition(" ")[0]
    v[name + ".ci"] = lambda: once().partition(" ")[2]


def _span(figures: list[tuple[float, str]]) -> str:
    """``low–high`` of printed figures (ordered by the numbers they print), one unit suffix."""
    lo, hi = min(figures)[1], max(figures)[1]
    return f"{lo.removesuffix('×')}–{hi}"


def _one(xs: list[Any], what: str) -> Any:
    """The value every element of ``xs`` shares (a count the prose states once)."""
    if len(set(xs)) != 1:
        raise ValueError(f"{what} differ: {sorted(set(xs))}")
    return xs[0]


def values(raw: dict[str, Any], raw_name: str) -> dict[str, Value]:
    """Every name a template may use, each computed from ``raw`` only when used.  R is a
    regime as the tables name it (``const``, ``grow``, ``work``, ``mutate``, or a state size,
    ``1KiB`` … ``10MiB``), N the history length in digits (``10000``), S a strategy
    (``cont``, ``hybrid``, ``replay``); every family marked † also has ``NAME.ci``."""
    prov = raw.get("provenance") or {}
    v: dict[str, Value] = {
        "raw_file": lambda: raw_name,  # the raw file's name (the paper cites it in data/)
        "profile": lambda: raw["profile"],  # `full`
        "commit": lambda: prov["git_sha"][:7],  # the commit measured
        # whether the tree had uncommitted changes at that commit
        "tree": lambda: ("a tree that changed during the run" if provenance.changed_during(prov) else
                         {False: "a clean tree", True: "uncommitted changes"}[prov["git_dirty"]]),
        "python": lambda: raw["python"],  # the interpreter's version
        "cpus": lambda: str(raw["cpus"]),  # CPUs the machine had
        "elapsed": lambda: count(raw["elapsed_s"]),  # the run's wall time, s
        "fsync": lambda: provenance.figures(prov)["fsync"],  # a 4 KiB fsync, median, ms
        "load_before": lambda: provenance.figures(prov)["load_before"],  # 1-min load, start
        "load_after": lambda: provenance.figures(prov)["load_after"],  # ... and end
        "work_ms": lambda: f"{raw['work_ms']:g}",  # CPU between effects in regime `work`, ms
        "hybrid_k": lambda: str(raw["hybrid_k"]),  # hybrid's snapshot interval K
        # repetitions of every recovery case, of every step-cost case, of every steady-state case
        "repeats.recovery": lambda: str(_one([len(r["in_process_s"]) for r in raw["recovery"]],
                                             "recovery repetitions")),
        "repeats.step_cost": lambda: str(_one([len(r["mean_step_s"]) for r in raw["step_costs"]],
                                              "step-cost repetitions")),
        "repeats.steady": lambda: str(_one([len(r["step_s"]) for r in raw["steady"]], "steady-state repetitions")),
        # continuation's whole-process recovery in `const`, lowest–highest median over N (ms)
        "span.whole.const.cont": lambda: _span(
            [(med(r["whole_process_s"]), ms(med(r["whole_process_s"]))) for r in raw["recovery"]
             if r["strategy"] == "continuation" and r["regime"] == "const"]),
        # ... and as a multiple of `python -c pass`, lowest–highest (``6.1–7.7×``)
        "span.bare.const.x": lambda: _span(
            [(x, times(x, 1)) for x in (med(r["whole_process_s"]) / med(r["bare_interpreter_s"])
                                        for r in raw["recovery"] if r["strategy"] == "continuation"
                                        and r["regime"] == "const")]),
        # continuation's in-process recovery for states up to 1 MiB, lowest–highest (ms)
        "span.in.upto1MiB.cont": lambda: _span(
            [(med(r["in_process_s"]), ms(med(r["in_process_s"]))) for r in raw["recovery"]
             if r["strategy"] == "continuation" and r["regime"].startswith("size:")
             and int(r["regime"][5:]) <= 1 << 20]),
    }
    # † in.R.N.S, whole.R.N.S, inplace.R.N.S: recovery in-process / whole process / whole
    # process in place (ms, median); † in.R.N.hybrid/cont, in.R.N.replay/cont, ...: ratios
    for key, prefix in (("in_process_s", "in"), ("whole_process_s", "whole"), ("in_place_whole_s", "inplace")):
        cases: dict[tuple[str, int], dict[str, list[float]]] = {}
        for row in raw.get("recovery", []):
            cases.setdefault((row["regime"], row["n"]), {})[row["strategy"]] = row.get(key, [])
        for (regime, n), by in cases.items():
            at = f"{prefix}.{_regime(regime)}.{n}"
            for strategy, xs in by.items():
                _cell(v, f"{at}.{_STRATEGIES[strategy]}", functools.partial(ms_ci, xs))
                if strategy != "continuation":
                    _cell(v, f"{at}.{_STRATEGIES[strategy]}/cont",
                          functools.partial(ratio_cell, xs, by.get("continuation", [])))
    for row in raw.get("recovery", []):
        if row["strategy"] == "continuation" and row.get("bare_interpreter_s"):
            at, bare = f"bare.{_regime(row['regime'])}.{row['n']}", row["bare_interpreter_s"]
            v[at] = functools.partial(lambda b: ms(med(b)), bare)  # bare.R.N: `python -c pass`, ms
            # bare.R.N.x: continuation's whole-process recovery / `python -c pass`
            v[at + ".x"] = functools.partial(lambda r, b: times(med(r) / med(b), 1),
                                             row["whole_process_s"], bare)
    _peer_values(v, raw)
    _step_values(v, raw)
    _pg_values(v, raw)
    ckpt = sorted(raw.get("checkpoint", []), key=lambda r: r["state_bytes"])
    for row in ckpt:
        at = "ckpt." + _regime(f"size:{row['state_bytes']}")
        v.update({
            f"{at}.snapshot_bytes": functools.partial(count, row["snapshot_bytes"]),  # bytes
            f"{at}.step": functools.partial(lambda r: ms(med(r["step_s_continuation"])), row),  # ms
            f"{at}.journal": functools.partial(lambda r: ms(med(r["step_s_journal_only"])), row),  # ms
            f"{at}.overhead": functools.partial(ms, row["checkpoint_overhead_s"]),  # ms per step
            f"{at}.floor": functools.partial(ms, row["raw_lmdb_commit_s"]),  # raw LMDB floor, ms
            f"{at}.x": functools.partial(times, row["ratio_vs_raw"]),  # overhead / floor
            # the overhead as a multiple of the overhead at the smallest state
            f"{at}.overhead/first": functools.partial(
                lambda r: times(r["checkpoint_overhead_s"] / ckpt[0]["checkpoint_overhead_s"]), row),
        })
    for row in raw.get("recovery", []):  # bytes.R.N.S: store bytes per step
        v[f"bytes.{_regime(row['regime'])}.{row['n']}.{_STRATEGIES[row['strategy']]}"] = (
            functools.partial(count, row["bytes_per_step"]))
    yd = raw.get("young_daly")
    if yd:
        sweep = {r["k"]: r for r in yd["sweep"]}
        v.update({
            "yd.C": lambda: ms(yd["checkpoint_s"]),  # checkpoint cost per snapshot, ms
            "yd.step": lambda: ms(yd["step_s"]),  # step time, ms
            "yd.interval": lambda: count(yd["k_opt"]),  # Young-Daly interval, steps
            "yd.best_k": lambda: str(yd["best_measured_k"]),  # best K of the sweep
            # the expected overhead at that K
            "yd.best.overhead": lambda: share(sweep[yd["best_measured_k"]]["expected_overhead"]),
        })
        for k, r in sweep.items():  # yd.K.step, yd.K.recovery (ms), yd.K.overhead: the sweep
            v[f"yd.{k}.step"] = functools.partial(ms, r["step_s"])
            v[f"yd.{k}.recovery"] = functools.partial(lambda r: ms(med(r["recovery_s"])), r)
            v[f"yd.{k}.overhead"] = functools.partial(share, r["expected_overhead"])
    return v


def _peer_values(v: dict[str, Value], raw: dict[str, Any]) -> None:
    """The peer table: peer.P.R.CACHE.N.F for P in ``tcc``, ``dbos``, ``langgraph``; F:
    † ``in``, † ``whole`` (ms), ``imports`` (ms), † ``in/tcc``, † ``whole/tcc``, ``storage``
    (bytes at the crash), † ``no_poll`` and ``poll`` (DBOS without / its queue poll wait,
    ms); and version.P, the version every row of P ran."""
    if not raw.get("peers"):
        return
    _, ref = peer_reference(raw)
    versions: dict[str, list[str]] = {}
    for row in raw["peers"]:
        regime, n, cache = row.get("regime_label", row["regime"]), row["n"], row.get("condition", "warm")
        at, base = f"peer.{row['peer']}.{regime}.{cache}.{n}", ref.get((regime, n, cache))
        versions.setdefault(row["peer"], []).append(row.get("version", ""))
        _cell(v, f"{at}.in", functools.partial(ms_ci, row["in_process_s"]))
        _cell(v, f"{at}.whole", functools.partial(ms_ci, row["whole_process_s"]))
        imports = row.get("breakdown_s", {}).get("imports_s")
        if imports:
            v[f"{at}.imports"] = functools.partial(lambda xs: ms(med(xs)), imports)
        if base:
            _cell(v, f"{at}.in/tcc", functools.partial(ratio_cell, row["in_process_s"], base["in_process_s"]))
            _cell(v, f"{at}.whole/tcc",
                  functools.partial(ratio_cell, row["whole_process_s"], base["whole_process_s"]))
        v[f"{at}.storage"] = functools.partial(
            lambda r: count(int(r.get("storage_bytes_at_crash", r.get("storage_bytes", 0)))), row)
        excl = row.get("breakdown_s", {}).get("in_process_excl_poll_s")
        if excl:
            _cell(v, f"{at}.no_poll", functools.partial(ms_ci, excl))
            v[f"{at}.poll"] = functools.partial(lambda xs: ms(med(xs)), row["breakdown_s"]["queue_poll_wait_s"])
    for peer, seen in versions.items():
        v[f"version.{peer}"] = functools.partial(_one, seen, f"{peer} versions")


def _pg_rows(raw: dict[str, Any]) -> dict[tuple[str, int], dict[str, Any]]:
    """The PostgreSQL section's measured rows by (system, N) (regime `const`)."""
    pg = raw.get("postgres") or {}
    return {(r["system"], r["n"]): r for r in pg.get("rows", [])
            if not r.get("missing") and r["regime"] == "const"}


def _pg_values(v: dict[str, Value], raw: dict[str, Any]) -> None:
    """The PostgreSQL table: pg.SYS.N.F for SYS in ``tcc``, ``dbos``, ``langgraph``; F: †
    ``step`` (per-step overhead), † ``in``, † ``whole`` (ms), ``imports`` (ms, of the
    in-process child), ``storage`` (bytes after N), † ``step/tcc``, † ``in/tcc``, †
    ``whole/tcc`` (against tcc), ``step/floor``; † ``no_poll``, ``poll`` (DBOS); pg.floor
    (INSERT + COMMIT, ms), pg.server (its version), pg.repeats, pg.version.SYS."""
    pg = raw.get("postgres") or {}
    rows = _pg_rows(raw)
    if not rows:
        return
    floor = pg["floor"]["median_s"]
    v["pg.floor"] = lambda: f"{floor * 1e3:.3f}"
    v["pg.server"] = lambda: pg["server_settings"]["server_version"].split()[0]
    v["pg.repeats"] = lambda: str(_one([len(r["per_step_s"]) for r in rows.values()], "PostgreSQL repetitions"))
    for system in {s for s, _ in rows}:
        v[f"pg.version.{system}"] = functools.partial(
            _one, [str(r.get("version", "")) for (s, _), r in rows.items() if s == system], f"{system} versions")
    for (system, n), row in rows.items():
        at, tcc = f"pg.{system}.{n}", rows.get(("tcc", n))
        for key, name in (("per_step_s", "step"), ("in_process_s", "in"), ("whole_process_s", "whole")):
            _cell(v, f"{at}.{name}", functools.partial(ms_ci, row[key]))
            if tcc is not None and system != "tcc":
                _cell(v, f"{at}.{name}/tcc", functools.partial(ratio_cell, row[key], tcc[key]))
        v[f"{at}.step/floor"] = functools.partial(lambda r: times(med(r["per_step_s"]) / floor, 1), row)
        v[f"{at}.storage"] = functools.partial(lambda r: count(r["storage_after_n"]["tables"]), row)
        parts = row.get("breakdown_s", {})
        for part, name in (("imports_s", "imports"), ("open_s", "open"), ("open_to_step_s", "open_to_step")):
            if parts.get(part):  # pg.SYS.N.imports, .open, .open_to_step: ms, of the in-process child
                v[f"{at}.{name}"] = functools.partial(lambda xs: ms(med(xs)), parts[part])
        if parts.get("in_process_excl_poll_s"):
            _cell(v, f"{at}.no_poll", functools.partial(ms_ci, parts["in_process_excl_poll_s"]))
            v[f"{at}.poll"] = functools.partial(lambda xs: ms(med(xs)), parts["queue_poll_wait_s"])


def _step_values(v: dict[str, Value], raw: dict[str, Any]) -> None:
    """The step-cost table: † step.R.N.SYS for SYS in ``cont``, ``replay`` (tcc's),
    ``dbos``, ``langgraph``, ``langgraph-delta`` (ms per step), † step.R.N.cont/PEER; and the steady-state table:
    † steady.R.N.cont, † steady.R.N.replay (ms per step), † steady.R.N.cont/replay,
    † steady.R.N.cont/first (against the smallest N), steady.R.N.n (repetitions),
    span.steady.cont/replay (lowest–highest continuation/replay over every N); the held
    ``bytes`` row: held.size (``100 MiB``), held.with, held.without (ms per step), held.x."""
    rows = raw.get("step_costs") or []
    for row in rows:
        system = row["system"].removeprefix("tcc ").replace("continuation", "cont").replace(" ", "-")
        at = f"step.{row.get('regime', 'grow')}.{row['n']}"
        _cell(v, f"{at}.{system}", functools.partial(ms_ci, row["mean_step_s"]))
        cont = [r for r in rows if r["system"] == "tcc continuation" and r["n"] == row["n"]
                and r.get("regime", "grow") == row.get("regime", "grow")]
        if not row["system"].startswith("tcc") and cont:
            _cell(v, f"{at}.cont/{system}",
                  functools.partial(ratio_cell, cont[0]["mean_step_s"], row["mean_step_s"]))
    steady = {(r["kind"], r["n"], r["strategy"], r["regime"]): r["step_s"] for r in raw.get("steady") or []}
    for kind in ("grow", "mutate"):
        sizes = sorted({n for (k, n, _, _) in steady if k == kind})
        for n in sizes:
            c, r = steady[(kind, n, "continuation", kind)], steady[(kind, n, "replay", kind)]
            at = f"steady.{kind}.{n}"
            _cell(v, f"{at}.cont", functools.partial(ms_ci, c))
            _cell(v, f"{at}.replay", functools.partial(ms_ci, r))
            _cell(v, f"{at}.cont/replay", functools.partial(ratio_cell, c, r))
            v[f"{at}.n"] = functools.partial(str, len(c))
            if n != sizes[0]:
                _cell(v, f"{at}.cont/first",
                      functools.partial(ratio_cell, c, steady[(kind, sizes[0], "continuation", kind)]))
    # span.steady.cont/replay: continuation/replay in the steady state, lowest–highest median
    # over every N of `grow` and `mutate` (``2.42–3.77×``)
    ratios = [med(xs) / med(steady[(k, n, "replay", r)]) for (k, n, s, r), xs in steady.items()
              if k in ("grow", "mutate") and s == "continuation"]
    if ratios:
        v["span.steady.cont/replay"] = lambda: _span([(x, times(x)) for x in ratios])
    held = [(k, xs) for k, xs in steady.items() if k[0] == "hold" and k[3].startswith("hold:")]
    if len(held) == 1:
        (_, n, _, regime), with_it = held[0]
        plain = steady[("hold", n, "continuation", "const")]
        v.update({
            "held.size": lambda: f"{count(int(regime[5:]) / (1 << 20))} MiB",
            "held.with": lambda: ms(med(with_it)),
            "held.without": lambda: ms(med(plain)),
            "held.x": lambda: times(med(with_it) / med(plain)),
        })


# -------------------------------------------------------------------- claims


def _ratio(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """median(xs)/median(ys) and its 95% interval (NaN without enough repetitions)."""
    if min(len(xs), len(ys)) < MIN_FOR_INTERVAL:
        return med(xs) / med(ys), math.nan, math.nan
    return (med(xs) / med(ys), *ratio_ci95(xs, ys))


def _below(xs: list[float], ys: list[float]) -> bool:
    """xs is called smaller than ys: the ratio's interval lies below 1 (NaN: never)."""
    return _ratio(xs, ys)[2] < 1


def _above(xs: list[float], ys: list[float]) -> bool:
    return _ratio(xs, ys)[1] > 1


def _rec(raw: dict[str, Any], key: str = "in_process_s") -> dict[tuple[str, int, str], list[float]]:
    return {(r["regime"], r["n"], r["strategy"]): r.get(key, []) for r in raw["recovery"]}


def _peer(raw: dict[str, Any], peer: str, cache: str = "warm", regime: str = "const",
          n: int = 1000) -> dict[str, Any]:
    rows = [r for r in raw["peers"] if r["peer"] == peer and r.get("condition", "warm") == cache
            and r.get("regime_label", r["regime"]) == regime and r["n"] == n]
    if len(rows) != 1:
        raise KeyError(f"{len(rows)} rows of {peer} {regime} {cache} N={n:,}")
    row: dict[str, Any] = rows[0]
    return row


def _steps(raw: dict[str, Any]) -> dict[tuple[str, int, str], list[float]]:
    return {(r.get("regime", "grow"), r["n"], r["system"]): r["mean_step_s"] for r in raw["step_costs"]}


def const_flat(raw: dict[str, Any]) -> Verdict:
    """"in `const` the medians from N = 10 to N = 10,000 lie within half of one another"
    (§5), goal (1) "met under a relaxed criterion": the largest median of continuation's
    in-process recovery over N is at most 1.5 times the smallest."""
    rec = _rec(raw)
    cells = {n: rec[(r, n, s)] for (r, n, s) in rec if r == "const" and s == "continuation"}
    meds = [med(xs) for xs in cells.values()]
    shown = ", ".join(f"N={n:,}: {ms_ci(xs)}" for n, xs in sorted(cells.items()))
    return max(meds) <= 1.5 * min(meds), f"{shown}; largest / smallest {times(max(meds) / min(meds))}"


def _const_apart(raw: dict[str, Any]) -> list[str]:
    """The pairs of N whose `const` continuation in-process intervals do not overlap."""
    from benchmarks.report import ci95

    rec = _rec(raw)
    cells = {n: ci95(rec[(r, n, s)]) for (r, n, s) in rec if r == "const" and s == "continuation"}
    return [f"N={a:,} {ms(cells[a][0])}–{ms(cells[a][1])} and N={b:,} {ms(cells[b][0])}–{ms(cells[b][1])}"
            for a in cells for b in cells if a < b
            and (cells[a][1] < cells[b][0] or cells[b][1] < cells[a][0])]


def const_intervals_disagree(runs: list[tuple[dict[str, Any], str]]) -> Verdict:
    """Goal (1), the criterion first stated (intervals that overlap at every N): "the runs
    disagree": in one of the runs judged (the rendered one and each ``also:``) every interval
    of continuation's in-process recovery in `const` overlaps every other, and in another two
    do not.  Judged once, over all the runs."""
    apart = {name: _const_apart(raw) for raw, name in runs}
    return (any(apart.values()) and not all(apart.values()),
            "; ".join(f"{name}: {', '.join(pairs) or 'all overlap'}" for name, pairs in apart.items()))


def delta_grow_100_disagree(runs: list[tuple[dict[str, Any], str]]) -> Verdict:
    """"not called cheaper: the runs disagree" (§5, LangGraph with DeltaChannel in `grow` at
    N = 100): continuation's step lies below the delta saver's in one of the runs judged and
    not in another.  Judged once, over all the runs."""
    cells = {name: _step_cells(raw)[("grow", 100, DELTA)] for raw, name in runs}
    below = [_below(*c) for c in cells.values()]
    return any(below) and not all(below), "; ".join(f"{name}: {ratio_cell(*c)}" for name, c in cells.items())


def state_grows(raw: dict[str, Any]) -> Verdict:
    """"What does grow is the state" (§5): continuation's in-process recovery in `grow` at
    the largest N, and with the largest state, lies above `const` / the next state size."""
    rec = _rec(raw)
    n = max(n for (r, n, _) in rec if r == "grow")
    sizes = sorted(int(r[5:]) for (r, _, s) in rec if r.startswith("size:") and s == "continuation")
    pairs = [(rec[("grow", n, "continuation")], rec[("const", n, "continuation")]),
             (rec[(f"size:{sizes[-1]}", 100, "continuation")], rec[(f"size:{sizes[-2]}", 100, "continuation")])]
    return (all(_above(a, b) for a, b in pairs),
            "; ".join(f"{ratio_cell(a, b)} ({ms_ci(a)} against {ms_ci(b)})" for a, b in pairs))


def replay_grows(raw: dict[str, Any]) -> Verdict:
    """"Replay grows with history" (§5): replay's median in-process recovery rises with N
    in `const`, `grow` and `work`."""
    rec, shown, ok = _rec(raw), [], True
    for regime in ("const", "grow", "work"):
        meds = [med(xs) for (r, n, s), xs in sorted(rec.items()) if r == regime and s == "replay"]
        ok = ok and meds == sorted(meds)
        shown.append(f"{regime}: " + ", ".join(ms(m) for m in meds))
    return ok, "; ".join(shown)


def replay_not_slower_at_10(raw: dict[str, Any]) -> Verdict:
    """"at N = 10 without work between effects replay is as fast or faster" (§5, §6): at
    N = 10 replay/continuation lies above 1 in neither `const` nor `grow`, and above 1 in
    `work`."""
    rec = _rec(raw)
    pairs = {r: (rec[(r, 10, "replay")], rec[(r, 10, "continuation")])
             for (r, n, s) in sorted(rec) if n == 10 and s == "continuation"}
    return (not _above(*pairs["const"]) and not _above(*pairs["grow"]) and _above(*pairs["work"]),
            ", ".join(f"{r}: {ratio_cell(*p)}" for r, p in pairs.items()))


def continuation_ahead_at_100(raw: dict[str, Any]) -> Verdict:
    """"At N = 100 continuation is already ahead in every regime" (§5, §6): in-process
    replay/continuation at N = 100 lies above 1 in every regime measured there (`const`,
    `work`, `grow` and every state size)."""
    rec = _rec(raw)
    cells = {r: (rec[(r, 100, "replay")], rec[(r, 100, "continuation")])
             for (r, n, s) in sorted(rec) if n == 100 and s == "continuation"}
    return (all(_above(*c) for c in cells.values()),
            ", ".join(f"{r}: {ratio_cell(*p)}" for r, p in cells.items()))


def continuation_ahead_from_1000(raw: dict[str, Any]) -> Verdict:
    """"From N = 1,000 on continuation is ahead in every regime" (§5, §6): in-process
    replay/continuation lies above 1 in every regime at every N ≥ 1,000."""
    rec = _rec(raw)
    cases = sorted((r, n) for (r, n, s) in rec if n >= 1000 and s == "continuation")
    cells = {c: (rec[(*c, "replay")], rec[(*c, "continuation")]) for c in cases}
    return (all(_above(*p) for p in cells.values()),
            ", ".join(f"{r} N={n:,}: {ratio_cell(*p)}" for (r, n), p in cells.items()))


def goal2_met_in_process(raw: dict[str, Any]) -> Verdict:
    """Goal (2) "met in-process": replay/continuation in-process in `work` at the largest N
    has an interval whose low end is at least 100."""
    rec = _rec(raw)
    n = max(n for (r, n, _) in rec if r == "work")
    xs, ys = rec[("work", n, "replay")], rec[("work", n, "continuation")]
    return _ratio(xs, ys)[1] >= 100, f"work N={n:,}: {ratio_cell(xs, ys)}"


def goal2_not_met_whole_process(raw: dict[str, Any]) -> Verdict:
    """Goal (2) "as whole processes ..., because both pay start-up": the whole-process ratio
    in `work` at the largest N is below 100 (the goal is met in-process only)."""
    rec = _rec(raw, "whole_process_s")
    n = max(n for (r, n, _) in rec if r == "work")
    xs, ys = rec[("work", n, "replay")], rec[("work", n, "continuation")]
    return _ratio(xs, ys)[0] < 100, f"work N={n:,}: {ratio_cell(xs, ys)}"


def goal3_met_against_dbos(raw: dict[str, Any]) -> Verdict:
    """Goal (3) "met against DBOS": DBOS/tcc lies above 1 in-process and as whole processes
    (`const`, warm, N = 1,000)."""
    dbos, tcc = _peer(raw, "dbos"), _peer(raw, "tcc")
    pairs = [(dbos[k], tcc[k]) for k in ("in_process_s", "whole_process_s")]
    return (all(_above(*p) for p in pairs),
            f"in-process {ratio_cell(*pairs[0])}, whole process {ratio_cell(*pairs[1])}")


def langgraph_faster_in_process(raw: dict[str, Any]) -> Verdict:
    """"LangGraph recovers faster than tcc in-process, in every cache condition" (§5), goal
    (3) "Not met against LangGraph in-process": LangGraph/tcc in-process lies below 1 in
    every LangGraph row."""
    _, ref = peer_reference(raw)
    cells = {}
    for row in raw["peers"]:
        if row["peer"] == "langgraph":
            key = (row.get("regime_label", row["regime"]), row["n"], row.get("condition", "warm"))
            cells[key] = (row["in_process_s"], ref[key]["in_process_s"])
    return (bool(cells) and all(_below(*p) for p in cells.values()),
            ", ".join(f"{r} {c} N={n:,}: {ratio_cell(*p)}" for (r, n, c), p in cells.items()))


def langgraph_slower_only_by_imports(raw: dict[str, Any]) -> Verdict:
    """"As whole processes tcc is ...×* faster, but ... are imports", goal (3) "met as whole
    processes only through LangGraph's import time": LangGraph/tcc as whole processes lies
    above 1, and LangGraph's whole process less its imports is under tcc's whole process."""
    lg, tcc = _peer(raw, "langgraph"), _peer(raw, "tcc")
    rest = med(lg["whole_process_s"]) - med(lg["breakdown_s"]["imports_s"])
    return (_above(lg["whole_process_s"], tcc["whole_process_s"]) and rest < med(tcc["whole_process_s"]),
            f"whole {ratio_cell(lg['whole_process_s'], tcc['whole_process_s'])}; LangGraph without "
            f"imports {ms(rest)} ms against tcc's whole {ms(med(tcc['whole_process_s']))} ms")


def dbos_far_slower_without_poll(raw: dict[str, Any]) -> Verdict:
    """"without the poll, ... still far above tcc's ... ms": DBOS's in-process median without
    its queue poll is at least 10 times tcc's (`const`, warm, N = 1,000)."""
    dbos, tcc = _peer(raw, "dbos"), _peer(raw, "tcc")
    excl, base = med(dbos["breakdown_s"]["in_process_excl_poll_s"]), med(tcc["in_process_s"])
    return excl >= 10 * base, f"{ms(excl)} ms against {ms(base)} ms"


def dbos_poll_about_a_second(raw: dict[str, Any]) -> Verdict:
    """"DBOS's ~1 s queue poll interval" (§7): its measured poll wait rounds to 1 s."""
    wait = med(_peer(raw, "dbos")["breakdown_s"]["queue_poll_wait_s"])
    return round(wait) == 1, f"{ms(wait)} ms"


DELTA = "langgraph delta"  # LangGraph with DeltaChannel (benchmarks/peers/langgraph_peer.py)


def _step_cells(raw: dict[str, Any]) -> dict[tuple[str, int, str], tuple[list[float], list[float]]]:
    """(continuation, peer) step costs of every case measured against DBOS, LangGraph and
    LangGraph with DeltaChannel."""
    steps = _steps(raw)
    return {(r, n, p): (steps[(r, n, "tcc continuation")], xs) for (r, n, p), xs in steps.items()
            if p in ("dbos", "langgraph", DELTA)}


def step_cost_against_peers(raw: dict[str, Any]) -> Verdict:
    """"Per step, tcc is cheaper than DBOS in every case measured, and never dearer than
    LangGraph's default saver" (§5): continuation/DBOS lies below 1 in every case, and
    continuation/LangGraph above 1 in none."""
    cells = _step_cells(raw)
    dbos = [c for (_, _, p), c in cells.items() if p == "dbos"]
    default = [c for (_, _, p), c in cells.items() if p == "langgraph"]
    return (bool(dbos) and all(_below(*c) for c in dbos) and not any(_above(*c) for c in default),
            ", ".join(f"{r} N={n:,} /{p}: {ratio_cell(*c)}" for (r, n, p), c in cells.items() if p != DELTA))


# The cases measured (STEP_CASES); those in which §5 says tcc's step is cheaper (the interval
# lies below 1: STEP_CHEAPER), those in which it says it is not (STEP_NOT_CHEAPER: the
# interval does not lie below 1), and those in which it says it is not dearer (STEP_NOT_DEARER:
# the interval does not lie above 1).  The others go unsaid: quiet full runs disagree on them.
STEP_CASES = ({(r, n, p) for r in ("const", "grow", "mutate") for n in (100, 1000)
               for p in ("dbos", "langgraph", DELTA)}
              | {("grow", 10000, "dbos"), ("grow", 10000, DELTA)})
STEP_CHEAPER = ({k for k in STEP_CASES if k[2] == "dbos"}
                | {("const", 1000, "langgraph"), ("grow", 1000, "langgraph"), ("mutate", 1000, "langgraph")}
                | {("const", 100, DELTA), ("const", 1000, DELTA), ("grow", 10000, DELTA)})
STEP_NOT_CHEAPER = {("grow", 1000, DELTA), ("mutate", 1000, DELTA)}
STEP_NOT_DEARER = {("grow", 100, DELTA)}


def step_cost_as_listed(raw: dict[str, Any]) -> Verdict:
    """"cheaper than LangGraph's default saver in every regime at N = 1,000; than LangGraph
    with DeltaChannel in `const` at N = 100 and 1,000 and in `grow` at N = 10,000, not dearer
    in `grow` at N = 100, and not cheaper in `grow` and `mutate` at N = 1,000" (§5, and the
    step-cost table's cells): the cases measured are STEP_CASES, continuation/peer lies below
    1 in each of STEP_CHEAPER and in none of STEP_NOT_CHEAPER, and above 1 in none of
    STEP_NOT_DEARER."""
    cells = _step_cells(raw)
    below = {k for k, c in cells.items() if _below(*c)}
    above = {k for k, c in cells.items() if _above(*c)}
    return (set(cells) == STEP_CASES and STEP_CHEAPER <= below and not below & STEP_NOT_CHEAPER
            and not above & STEP_NOT_DEARER,
            ", ".join(f"{r} N={n:,} /{p}: {ratio_cell(*c)}" for (r, n, p), c in sorted(cells.items())))


def _undecided(raw: dict[str, Any], regime: str, n: int, peer: str) -> Verdict:
    steps = _steps(raw)
    xs, ys = steps[(regime, n, "tcc continuation")], steps[(regime, n, peer)]
    return not (_below(xs, ys) or _above(xs, ys)), f"{regime} N={n:,} /{peer}: {ratio_cell(xs, ys)}"


def no_difference_delta_grow(raw: dict[str, Any]) -> Verdict:
    """"in `grow` at N = 1,000 the difference from LangGraph with DeltaChannel is not shown":
    the interval holds 1."""
    return _undecided(raw, "grow", 1000, DELTA)


def langgraph_not_run_grow_10000(raw: dict[str, Any]) -> Verdict:
    """"not run" (§3, the step-cost table of §5): LangGraph has no step cost in `grow` at
    N = 10,000."""
    steps = _steps(raw)
    return ("grow", 10000, "langgraph") not in steps, f"{sorted(k for k in steps if k[2] == 'langgraph')}"


def steady_continuation_slower(raw: dict[str, Any]) -> Verdict:
    """"Against its own replay strategy (journal only) continuation is slower per step in
    the steady state" (§5), "Per step the order is reversed" (§6), with its span of ratios
    (``span.steady.cont/replay``): continuation/replay lies above 1 at every N of `grow` and
    `mutate` (its median, where there are too few repetitions for an interval)."""
    steady = {(r["kind"], r["n"], r["strategy"]): r["step_s"] for r in raw["steady"] if r["kind"] != "hold"}
    cells = {(k, n): (xs, steady[(k, n, "replay")]) for (k, n, s), xs in steady.items() if s == "continuation"}
    ok = all(_above(*c) if min(map(len, c)) >= MIN_FOR_INTERVAL else _ratio(*c)[0] > 1 for c in cells.values())
    return ok, ", ".join(f"{k} N={n:,}: {ratio_cell(*c)}" for (k, n), c in cells.items())


def checkpoint_overhead_grows_slowly(raw: dict[str, Any]) -> Verdict:
    """"The overhead is not a fixed cost: it grows with the state (at least twice over from
    1 KiB to 1 MiB), though far more slowly than the state does, and only at 10 MiB is it
    below the floor" (§5): the overhead at 1 MiB is at least twice that at 1 KiB (the
    smallest state) and grows by at most a tenth of the factor the state grows by; the
    overhead / floor ratio is below 1 at the largest state, 10 MiB, and at no other."""
    rows = sorted(raw["checkpoint"], key=lambda r: r["state_bytes"])
    first, mib = rows[0], next(r for r in rows if r["state_bytes"] == 1 << 20)
    growth = mib["checkpoint_overhead_s"] / first["checkpoint_overhead_s"]
    size = mib["state_bytes"] / first["state_bytes"]
    return (first["state_bytes"] == 1 << 10 and rows[-1]["state_bytes"] == 10 << 20 and 2 <= growth <= size / 10
            and rows[-1]["ratio_vs_raw"] < 1 and all(r["ratio_vs_raw"] >= 1 for r in rows[:-1]),
            f"overheads {', '.join(ms(r['checkpoint_overhead_s']) for r in rows)} ms; 1 MiB / 1 KiB "
            f"{times(growth)} for {size:,.0f}× the state; / floor "
            f"{', '.join(times(r['ratio_vs_raw']) for r in rows)}")


def snapshot_below_a_millisecond(raw: dict[str, Any]) -> Verdict:
    """"the cost of a snapshot after every effect below a millisecond" (§5): C is under
    1 ms."""
    return raw["young_daly"]["checkpoint_s"] < 1e-3, f"C = {ms(raw['young_daly']['checkpoint_s'])} ms"


def mtbf_one_hour(raw: dict[str, Any]) -> Verdict:
    """"for an assumed MTBF of one hour" (§5)."""
    return raw["young_daly"]["mtbf_s"] == 3600, f"MTBF = {raw['young_daly']['mtbf_s']} s"


def quiet_machine(raw: dict[str, Any]) -> Verdict:
    """"nothing else running" (§5), "had the machine to itself" (§7): the one-minute load
    average at the start and at the end is below the number of CPUs."""
    prov = raw["provenance"]
    before, after = prov["loadavg_before"][0], prov["loadavg_after"][0]
    return max(before, after) < raw["cpus"], f"load {before:.2f} → {after:.2f} on {raw['cpus']} CPUs"


def two_builds_per_case(raw: dict[str, Any]) -> Verdict:
    """"Two crashed stores are built per case" (§4)."""
    builds = {r.get("builds") for r in raw["recovery"]}
    return builds == {2}, f"builds per case: {sorted(builds, key=str)}"


LANGGRAPH_READ = "1.2.24"  # the LangGraph whose sources §8 describes


def langgraph_read_is_peer(raw: dict[str, Any]) -> Verdict:
    """"we read 1.2.24, the version our peer runs" (§8): the peer ran the version read."""
    seen = {r.get("version") for r in raw["peers"] if r["peer"] == "langgraph"}
    return seen == {LANGGRAPH_READ}, f"the peer ran {sorted(seen, key=str)}, §8 read {LANGGRAPH_READ}"


CLAIMS: dict[str, Callable[[dict[str, Any]], Verdict]] = {
    f.__name__: f for f in (
        const_flat, state_grows, replay_grows, replay_not_slower_at_10, continuation_ahead_at_100,
        continuation_ahead_from_1000, goal2_met_in_process, goal2_not_met_whole_process,
        goal3_met_against_dbos, langgraph_faster_in_process, langgraph_slower_only_by_imports,
        dbos_far_slower_without_poll, dbos_poll_about_a_second, step_cost_against_peers,
        step_cost_as_listed, no_difference_delta_grow,
        langgraph_not_run_grow_10000, steady_continuation_slower, checkpoint_overhead_grows_slowly,
        snapshot_below_a_millisecond, mtbf_one_hour, quiet_machine,
        two_builds_per_case, langgraph_read_is_peer,
    )
}


# Claims judged once over all the runs judged (the rendered one and each ``also:``): what
# the runs say together, such as that they disagree.
ACROSS_RUNS: dict[str, Callable[[list[tuple[dict[str, Any], str]]], Verdict]] = {
    f.__name__: f for f in (const_intervals_disagree, delta_grow_100_disagree)
}


# Claims about the rendered run itself (how it was made), not about a result: an ``also:``
# run is not judged by them (an earlier run may have had another LangGraph, say).
ABOUT_THE_RUN = frozenset({"quiet_machine", "mtbf_one_hour", "langgraph_read_is_peer",
                           "two_builds_per_case"})


# -------------------------------------------------------------------- rendering


def fill(template: str, raw: dict[str, Any], raw_name: str, where: str = "paper/tcc.in.md") -> str:
    """``template`` with its placeholders filled from ``raw`` (the file ``raw_name``).
    Raises PaperError listing every unknown name, malformed placeholder, value the raw
    file cannot give, claim that does not hold (in ``raw`` or in a run an ``also:`` names)
    and ``also:`` that names no committed full run, each with its line in ``where``."""
    named = values(raw, raw_name)
    problems: list[str] = []
    runs = [(raw, raw_name)]  # every claim must hold in each; figures come from the first

    def line(m: re.Match[str]) -> str:
        return f"{where}:{template.count(chr(10), 0, m.start()) + 1}"

    for m in _PLACEHOLDER.finditer(template):
        inside = _INSIDE.fullmatch(m.group(1))
        if inside is not None and (inside.group(1) or "").startswith("also:") \
                and inside.group(2) not in {name for _, name in runs}:  # (each run judged once)
            other = _also(inside.group(2), line(m), problems)
            if other is not None:
                runs.append((other, inside.group(2)))

    def one(m: re.Match[str]) -> str:
        at = line(m)
        inside = _INSIDE.fullmatch(m.group(1))
        if inside is None:
            problems.append(f"{at}: {m.group(0)!r} is not a placeholder ({{{{ name }}}}, {{{{ check: name }}}} "
                            "or {{ also: FILE }})")
            return ""
        kind, name = inside.groups()
        if kind and kind.startswith("also:"):
            return name  # loaded (or its problem said) above
        if kind:
            # (verdict, which run(s) it judges): each run, or all the runs at once
            if name in ACROSS_RUNS:
                verdicts = [(functools.partial(ACROSS_RUNS[name], runs),
                             "across " + ", ".join(judged_name for _, judged_name in runs))]
            elif name in CLAIMS:
                verdicts = [(functools.partial(CLAIMS[name], judged), f"in {judged_name}")
                            for judged, judged_name in (runs if name not in ABOUT_THE_RUN else runs[:1])]
            else:
                problems.append(f"{at}: unknown claim {name!r} (benchmarks/paper.py CLAIMS, ACROSS_RUNS)")
                return ""
            for verdict, judged_in in verdicts:
                try:
                    holds, shown = verdict()
                except (KeyError, IndexError, TypeError, AttributeError, ValueError,
                        ZeroDivisionError) as exc:  # (an older raw file's shape)
                    holds, shown = False, f"cannot be judged from the raw file ({exc!r})"
                if not holds:
                    problems.append(f"{at}: the claim {name!r} does not hold {judged_in} ({shown}): "
                                    "rewrite the sentence the check follows (and the check)")
            return ""
        if name not in named:
            problems.append(f"{at}: unknown placeholder {{{{ {name} }}}} (no such value from {raw_name}; "
                            "benchmarks/paper.py values() lists the names)")
            return ""
        try:
            return named[name]()
        except (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError) as exc:
            problems.append(f"{at}: {{{{ {name} }}}} cannot be computed from {raw_name} ({exc!r})")
            return ""

    text = _PLACEHOLDER.sub(one, template)
    for stray in ("{{", "}}"):
        if stray in _PLACEHOLDER.sub("", template):
            problems.append(f"{where}:{template.count(chr(10), 0, template.index(stray)) + 1}: "
                            f"an unmatched {stray!r}")
    if problems:
        raise PaperError(f"{where} does not render from {raw_name}:\n  " + "\n  ".join(problems))
    return text


def _also(name: str, at: str, problems: list[str]) -> dict[str, Any] | None:
    """The committed full run ``name`` (``paper/data/``) that an ``also:`` names, or None
    with the reason added to ``problems``."""
    path = DATA / name
    if "/" in name or not path.is_file():
        problems.append(f"{at}: {{{{ also: {name} }}}} names no raw file in paper/data/")
        return None
    try:
        other = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        problems.append(f"{at}: {{{{ also: {name} }}}} cannot be read ({exc})")
        return None
    if not isinstance(other, dict) or other.get("profile") != "full":
        problems.append(f"{at}: {{{{ also: {name} }}}} is not a full run's raw file (claims are "
                        "checked against full runs only)")
        return None
    return other


def paper_text(raw: dict[str, Any], raw_name: str, template: pathlib.Path | None = None) -> str:
    """``paper/tcc.md`` as the template (default ``paper/tcc.in.md``) renders it from ``raw``."""
    return BANNER + fill((template or TEMPLATE).read_text(), raw, raw_name)


def publish(raw: dict[str, Any], source: pathlib.Path, log: Callable[[str], None] = print) -> None:
    """Write ``paper/tcc.md`` from its template and ``raw`` (read from ``source``), after
    copying ``source`` into ``paper/data/``, where the paper cites it, if it is not there."""
    text = paper_text(raw, source.name)
    kept = DATA / source.name
    if not kept.exists():
        kept.write_bytes(source.read_bytes())
        log(f"copied {source} to {kept}")
    elif kept.read_bytes() != source.read_bytes():
        raise PaperError(f"{kept} exists and differs from {source}: the paper would cite the wrong file")
    PAPER.write_text(text)
    log(f"rendered {PAPER} from {TEMPLATE.name}")
