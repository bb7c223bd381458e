"""The paper's results (§5 and §6 of ``paper/tcc.md``) quote only numbers that the committed
generated tables hold, and name the raw file and commit those tables were rendered from: a
new ``--full`` run that changes the tables makes this fail until the prose is updated."""

from __future__ import annotations

import json
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAPER = ROOT / "paper" / "tcc.md"
RESULTS = ROOT / "paper" / "generated" / "results.md"

# A measured figure: digits with a decimal part (1,724.61, 0.55, 8.45); integers in the prose
# are counts and protocol constants (N = 1,000, 50 steps, 128 bytes).
_FIGURE = re.compile(r"(?<![\w.,])\d{1,3}(?:,\d{3})*\.\d+(?![\d.])")

# Figures §5 quotes from an earlier raw file it names (to say what changed), and constants
# of the protocol that §3 states.
_ELSEWHERE = {
    "1.1",  # the in-process ratio to LangGraph that an earlier version of §5 called "met"
    "0.5",  # regime `work`: 0.5 ms of CPU between effects (§3)
}


def _results_sections() -> str:
    text = PAPER.read_text()
    return text[text.index("## 5. Results"):text.index("## 7. Threats to validity")]


def test_every_figure_in_the_results_is_in_the_generated_tables() -> None:
    held = set(_FIGURE.findall(RESULTS.read_text()))
    quoted = _FIGURE.findall(_results_sections())
    assert len(quoted) > 50  # the pattern finds the figures (it would pass vacuously otherwise)
    missing = sorted({q for q in quoted if q not in held and q not in _ELSEWHERE})
    assert missing == [], f"figures in paper/tcc.md §5-§6 that paper/generated/results.md lacks: {missing}"


def test_the_results_name_the_raw_file_and_commit_the_tables_came_from() -> None:
    section = _results_sections()
    # (§5 also names the two runs its claims are checked against)
    (name,) = set(re.findall(r"rendered from the raw\s+file `data/(recovery-full-[\d-]+\.json)`",
                             section.split("\n\n![")[0]))
    raw = json.loads((ROOT / "paper" / "data" / name).read_text())
    sha = raw["provenance"]["git_sha"]
    assert raw["provenance"]["git_dirty"] is False
    assert f"commit\n`{sha[:7]}`" in section or f"commit `{sha[:7]}`" in section
    assert f"commit {sha[:12]}" in RESULTS.read_text()  # the tables were rendered from this file
    assert raw["profile"] == "full"
