"""The benchmark protocol's bookkeeping: provenance in raw files, confidence intervals, and
short runs never rendering into the committed paper."""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
provenance = importlib.import_module("benchmarks.provenance")
report = importlib.import_module("benchmarks.report")


def test_provenance_names_the_commit_the_file_system_and_the_load(tmp_path: pathlib.Path) -> None:
    record = provenance.begin(tmp_path)
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                          text=True)
    if head.returncode == 0:  # a source tree without git records None, which is checked below
        assert record["git_sha"] == head.stdout.strip()
        assert isinstance(record["git_dirty"], bool)
    else:
        assert record["git_sha"] is None
    assert record["python"] == ".".join(map(str, sys.version_info[:3]))
    assert record["libraries"]["tcc"] is not None  # the package under test is installed
    assert record["kernel"] == os.uname().release
    fs = record["file_system"]
    assert fs["type"] and fs["path"] == os.path.realpath(tmp_path)
    assert fs["path"].startswith(fs["mount"].rstrip("/") + "/") or fs["path"] == fs["mount"]
    assert record["fsync"]["median_s"] > 0 and record["fsync"]["p90_s"] >= record["fsync"]["median_s"]
    assert list(tmp_path.iterdir()) == []  # the probe file is gone
    assert len(record["loadavg_before"]) == 3
    provenance.end(record)
    assert len(record["loadavg_after"]) == 3 and record["ended_utc"] >= record["started_utc"]
    assert record["git_sha_at_end"] == record["git_sha"]  # (no commit was made meanwhile)
    assert provenance.changed_during({**record, "git_dirty": False, "git_dirty_at_end": True})
    assert not provenance.changed_during({**record, "git_dirty": True, "git_dirty_at_end": True})
    assert not provenance.changed_during({"git_sha": "a", "git_dirty": False})  # an older file
    line = provenance.describe(record)
    assert (record["git_sha"] or "unknown")[:12] in line and fs["type"] in line
    assert "not recorded" in provenance.describe(None)


def test_a_bootstrap_interval_holds_the_median_and_widens_with_spread() -> None:
    tight = [1.0, 1.01, 0.99, 1.0, 1.02, 0.98, 1.0, 1.01, 0.99, 1.0]
    loose = [0.5, 1.5, 0.7, 1.3, 1.0, 0.6, 1.4, 0.9, 1.1, 1.0]
    lo_t, hi_t = report.ci95(tight)
    lo_l, hi_l = report.ci95(loose)
    assert lo_t <= 1.0 <= hi_t and lo_l <= 1.0 <= hi_l
    assert min(tight) <= lo_t and hi_t <= max(tight)
    assert hi_l - lo_l > 5 * (hi_t - lo_t)
    assert report.ci95(tight) == report.ci95(tight)  # seeded: a raw file renders the same


def test_a_ratio_is_called_a_difference_only_when_its_interval_excludes_one() -> None:
    fast = [1.0, 1.1, 0.9, 1.0, 1.05, 0.95, 1.0, 1.02, 0.98, 1.0]
    slow = [x * 2 for x in fast]
    noisy = [0.4, 1.8, 0.6, 1.6, 1.0, 0.5, 1.7, 0.9, 1.2, 1.1]
    assert report.ratio_cell(fast, slow).startswith("0.50×*")
    cell = report.ratio_cell(fast, noisy)
    assert "*" not in cell  # overlapping: no difference claimed
    lo, hi = report.ratio_ci95(fast, noisy)
    assert lo < 1 < hi


def test_a_quick_raw_file_renders_beside_itself_and_leaves_the_paper_alone(tmp_path: pathlib.Path) -> None:
    committed = sorted((ROOT / "paper" / "data").glob("recovery-full-*.json"))
    assert committed, "the paper's raw files are committed"
    raw = json.loads(committed[-1].read_text())
    raw["profile"] = "quick"  # as a --quick run would have written it
    raw["section_s"] = {"recovery": 1234.5, "step_costs": 67.0}
    src = tmp_path / "recovery-quick-1.json"
    src.write_text(json.dumps(raw))
    watched = [ROOT / "paper" / "generated" / "results.md", ROOT / "benchmarks" / "README.md",
               ROOT / "paper" / "tcc.md"]
    before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in watched}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.report", str(src)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "recovery-quick-1" / "results.md"
    assert out.exists() and str(out) in proc.stdout
    assert {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in watched} == before
    text = out.read_text()
    provenance = raw.get("provenance")  # files from before it was recorded have none
    described = f"commit {provenance['git_sha'][:12]}" if provenance else "provenance not recorded"
    assert "95% bootstrap interval" in text and described in text
    assert "Wall time by section: recovery 1,234 s, step costs 67 s." in text


def test_the_full_runs_postgres_section_measures_tcc_on_a_real_server_and_renders_its_table(
        tmp_path: pathlib.Path, pg_server: object) -> None:
    """``benchmarks.recovery --full`` ends with the PostgreSQL section: a throw-away server
    (its own), tcc's PostgreSQL store (and DBOS and LangGraph where installed) crashed,
    recovered and completed there, rendered with the floor and the ratios to tcc.  Tiny here
    (N = 10, one repetition); ``pg_server`` only makes the test skip (or fail, in CI) where
    this machine has no PostgreSQL."""
    recovery = importlib.import_module("benchmarks.recovery")
    spec = {"sizes": [10], "repeats": 1, "regimes": ["const"], "floor_block": 50}
    assert recovery.postgres_section({}, tmp_path, print) is None  # a profile without it
    raw = recovery.postgres_section({"postgres": spec}, tmp_path, print)
    assert raw is not None and "not_run" not in raw, raw
    assert raw["problems"] == [] and "tcc" in raw["systems"]
    assert raw["server_settings"]["fsync"] == "on" and raw["floor"]["median_s"] > 0
    rows = {r["system"]: r for r in raw["rows"]}
    assert set(rows) == set(raw["systems"])  # (a system not installed has no row)
    tcc = rows["tcc"]
    assert tcc["final_result"] == importlib.import_module("benchmarks.peers._agent").expected_result(10)
    assert len(tcc["per_step_s"]) == len(tcc["in_process_s"]) == len(tcc["whole_process_s"]) == 1
    lines = report.postgres_table({"postgres": raw})
    assert any(line.startswith("| tcc ") and "| const | 10 |" in line for line in lines), lines
    assert "fsync=on" in lines[0] and "INSERT" in lines[0]
    for name in raw["systems"]:  # every system measured has its row, with its ratio to tcc
        row = next(line for line in lines if line.startswith(f"| {name} "))
        assert ("—" in row) == (name == "tcc") and "×" in row
    assert report.postgres_table({}) == []
    skipped = report.postgres_table({"postgres": {"not_run": "no PostgreSQL server could be started: x"}})
    assert skipped == ["(not measured in this run: no PostgreSQL server could be started: x)"]
    problems = recovery.check({"recovery": [], "peers": [], "postgres": {"not_run": "no server"}})
    assert problems == ["postgres: no server"]
