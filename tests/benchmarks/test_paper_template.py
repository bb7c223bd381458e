"""The paper is rendered from its template (``paper/tcc.in.md``) and the raw file it cites:
the committed ``paper/tcc.md`` is exactly that rendering, its figures follow the raw data,
and a claim of its prose that the data stops supporting stops the render."""

from __future__ import annotations

import copy
import importlib
import json
import pathlib
import re
from typing import Any, Callable

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
paper = importlib.import_module("benchmarks.paper")
report = importlib.import_module("benchmarks.report")


def _cited() -> pathlib.Path:
    """The raw file §5 of the committed paper names."""
    text = paper.PAPER.read_text()
    section = text[text.index("## 5. Results"):text.index("![recovery vs N]")]
    (name,) = set(re.findall(r"rendered from the raw\s+file `data/(recovery-full-[\d-]+\.json)`", section))
    cited: pathlib.Path = paper.DATA / name
    return cited


@pytest.fixture(scope="module")
def raw() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(_cited().read_text())
    return data


def _row(raw: dict[str, Any], **match: Any) -> dict[str, Any]:
    rows: list[dict[str, Any]] = [r for r in raw["recovery"] if all(r[k] == v for k, v in match.items())]
    (row,) = rows
    return row


def _step(raw: dict[str, Any], **match: Any) -> dict[str, Any]:
    rows: list[dict[str, Any]] = [r for r in raw["step_costs"] if all(r[k] == v for k, v in match.items())]
    (row,) = rows
    return row


def _peer(raw: dict[str, Any], peer: str, cache: str = "warm") -> dict[str, Any]:
    rows: list[dict[str, Any]] = [r for r in raw["peers"] if r["peer"] == peer
                                  and r["regime_label"] == "const" and r["condition"] == cache]
    (row,) = rows
    return row


def test_the_committed_paper_is_its_template_rendered_from_the_raw_file_it_cites(raw: dict[str, Any]) -> None:
    template = paper.TEMPLATE.read_text()
    assert template.count("{{") > 100 and "{{ check:" in template  # figures are placeholders
    assert paper.paper_text(raw, _cited().name) == paper.PAPER.read_text(), (
        "paper/tcc.md is not paper/tcc.in.md rendered: edit the template and run "
        f"python -m benchmarks.report {_cited().relative_to(ROOT)}")


def test_every_claim_is_checked_by_the_template() -> None:
    used = set(re.findall(r"\{\{\s*check:\s*([\w./]+)\s*\}\}", paper.TEMPLATE.read_text()))
    assert used == set(paper.CLAIMS) | set(paper.ACROSS_RUNS)
    assert not set(paper.CLAIMS) & set(paper.ACROSS_RUNS)


def test_a_changed_figure_in_the_raw_file_changes_the_prose(raw: dict[str, Any]) -> None:
    changed = copy.deepcopy(raw)
    replay = _row(changed, regime="work", n=10000, strategy="replay")
    replay["in_process_s"] = [x * 1.5 for x in replay["in_process_s"]]
    _peer(changed, "langgraph")["storage_bytes_at_crash"] = 7654321.0
    changed["provenance"]["git_sha"] = "abcdef0" + "0" * 33
    cont = _row(changed, regime="work", n=10000, strategy="continuation")["in_process_s"]
    stored = report.count(int(_peer(raw, "langgraph")["storage_bytes_at_crash"]))  # as the paper prints it
    before = paper.paper_text(raw, "before.json")
    after = paper.paper_text(changed, "after.json")

    cell = report.ratio_cell(replay["in_process_s"], cont)  # as the table prints it
    assert f"**{cell}**" in after and f"**{cell}**" not in before
    assert cell in "\n".join(report.recovery_table(changed, "in_process_s"))
    assert f"{report.ms(report.med(replay['in_process_s']))} ms against" in after
    assert "LangGraph 7,654,321." in after and f"LangGraph {stored}." in before
    assert "commit\n`abcdef0`" in after and "`data/after.json`" in after
    assert "with a clean tree" in before


ClaimBreaker = Callable[[dict[str, Any]], None]


def _slower_langgraph(raw: dict[str, Any]) -> None:
    row = _peer(raw, "langgraph", "cold")
    row["in_process_s"] = [x * 3 for x in row["in_process_s"]]


def _faster_replay(raw: dict[str, Any]) -> None:
    row = _row(raw, regime="work", n=10000, strategy="replay")
    cont = _row(raw, regime="work", n=10000, strategy="continuation")["in_process_s"]
    row["in_process_s"] = [x * 50 for x in cont]  # 50x continuation: below the goal's 100x


def _unflat(raw: dict[str, Any]) -> None:
    row = _row(raw, regime="const", n=10000, strategy="continuation")
    row["in_process_s"] = [x * 2 for x in row["in_process_s"]]


def _dearer_steps(raw: dict[str, Any]) -> None:
    for row in raw["step_costs"]:
        if row["system"] == "tcc continuation" and row["regime"] == "grow" and row["n"] == 1000:
            row["mean_step_s"] = [x * 3 for x in row["mean_step_s"]]


def _slower_delta_steps(raw: dict[str, Any]) -> None:
    for row in raw["step_costs"]:
        if row["system"] == "langgraph delta" and row["regime"] == "mutate" and row["n"] == 1000:
            row["mean_step_s"] = [x * 3 for x in row["mean_step_s"]]


def _dearer_than_dbos(raw: dict[str, Any]) -> None:
    for row in raw["step_costs"]:
        if row["system"] == "dbos" and row["regime"] == "const" and row["n"] == 100:
            row["mean_step_s"] = [x / 5 for x in row["mean_step_s"]]


def _flat_checkpoints(raw: dict[str, Any]) -> None:
    smallest = min(raw["checkpoint"], key=lambda r: r["state_bytes"])
    for row in raw["checkpoint"]:
        if row["state_bytes"] == 1 << 20:
            row["checkpoint_overhead_s"] = smallest["checkpoint_overhead_s"] * 1.5


def _faster_replay_at_100(raw: dict[str, Any]) -> None:
    row = _row(raw, regime="grow", n=100, strategy="replay")
    row["in_process_s"] = [x / 3 for x in row["in_process_s"]]


def _faster_replay_at_100_with_1_mib(raw: dict[str, Any]) -> None:
    row = _row(raw, regime=f"size:{1 << 20}", n=100, strategy="replay")
    row["in_process_s"] = [x / 3 for x in row["in_process_s"]]


def _overlapping_const(raw: dict[str, Any]) -> None:
    """Every const continuation cell gets the samples of N = 100: all intervals overlap."""
    same = _row(raw, regime="const", n=100, strategy="continuation")["in_process_s"]
    for row in raw["recovery"]:
        if row["regime"] == "const" and row["strategy"] == "continuation":
            row["in_process_s"] = list(same)


def _slower_replay_at_10(raw: dict[str, Any]) -> None:
    row = _row(raw, regime="const", n=10, strategy="replay")
    row["in_process_s"] = [x * 3 for x in row["in_process_s"]]


def _replay_ahead_with_work_at_10(raw: dict[str, Any]) -> None:
    row = _row(raw, regime="work", n=10, strategy="replay")
    row["in_process_s"] = [x / 5 for x in row["in_process_s"]]


def _dearer_than_langgraph(raw: dict[str, Any]) -> None:
    for row in raw["step_costs"]:
        if row["system"] == "langgraph" and row["regime"] == "const" and row["n"] == 100:
            row["mean_step_s"] = [x / 5 for x in row["mean_step_s"]]


def _not_cheaper_than_langgraph_at_1000(raw: dict[str, Any]) -> None:
    for row in raw["step_costs"]:
        if row["system"] == "langgraph" and row["regime"] == "mutate" and row["n"] == 1000:
            cont = next(r for r in raw["step_costs"] if r["system"] == "tcc continuation"
                        and r["regime"] == "mutate" and r["n"] == 1000)
            row["mean_step_s"] = list(cont["mean_step_s"])  # the same samples: no difference


def _dearer_than_delta_in_grow_at_100(raw: dict[str, Any]) -> None:
    _step(raw, system="langgraph delta", regime="grow", n=100)["mean_step_s"] = [
        x / 3 for x in _step(raw, system="tcc continuation", regime="grow", n=100)["mean_step_s"]]


@pytest.mark.parametrize(("claim", "breaker"), [
    ("langgraph_faster_in_process", _slower_langgraph),
    ("goal2_met_in_process", _faster_replay),
    ("const_flat", _unflat),
    ("no_difference_delta_grow", _dearer_steps),
    ("step_cost_as_listed", _slower_delta_steps),
    ("step_cost_against_peers", _dearer_than_dbos),
    ("replay_not_slower_at_10", _slower_replay_at_10),
    ("replay_not_slower_at_10", _replay_ahead_with_work_at_10),
    ("step_cost_against_peers", _dearer_than_langgraph),
    ("step_cost_as_listed", _not_cheaper_than_langgraph_at_1000),
    ("step_cost_as_listed", _dearer_than_delta_in_grow_at_100),
    ("checkpoint_overhead_grows_slowly", _flat_checkpoints),
    ("continuation_ahead_at_100", _faster_replay_at_100),
    ("continuation_ahead_at_100", _faster_replay_at_100_with_1_mib),
])
def test_a_claim_the_data_no_longer_supports_stops_the_render(raw: dict[str, Any], claim: str,
                                                            breaker: ClaimBreaker) -> None:
    assert paper.CLAIMS[claim](raw)[0]
    broken = copy.deepcopy(raw)
    breaker(broken)
    assert not paper.CLAIMS[claim](broken)[0]
    with pytest.raises(paper.PaperError, match=rf"the claim '{claim}' does not hold in broken\.json") as info:
        paper.paper_text(broken, "broken.json")
    assert re.search(r"paper/tcc\.in\.md:\d+", str(info.value))  # where the sentence is


def test_an_unknown_or_malformed_placeholder_stops_the_render(raw: dict[str, Any]) -> None:
    with pytest.raises(paper.PaperError, match=r"tcc\.in\.md:2: unknown placeholder \{\{ in\.const\.7\.cont \}\}"):
        paper.fill("fine: {{ in.const.10.cont }}\n{{ in.const.7.cont }}\n", raw, "x.json")
    with pytest.raises(paper.PaperError, match="unknown claim 'paper_is_good'"):
        paper.fill("{{ check: paper_is_good }}", raw, "x.json")
    with pytest.raises(paper.PaperError, match="is not a placeholder"):
        paper.fill("{{ __import__('os') }}", raw, "x.json")
    with pytest.raises(paper.PaperError, match="an unmatched '{{'"):
        paper.fill("{{ python }} and {{ python", raw, "x.json")
    assert paper.fill("{{ python }}{{ check: const_flat }}, {{python}}", raw, "x.json") == "3.12.1, 3.12.1"


def _also_runs() -> list[str]:
    """The committed full runs the template names with ``{{ also: FILE }}``."""
    return re.findall(r"\{\{\s*also:\s*([\w.-]+)\s*\}\}", paper.TEMPLATE.read_text())


def test_every_claim_holds_in_the_cited_run_and_in_every_run_the_template_also_names(
        raw: dict[str, Any]) -> None:
    """The paper's claims are the ones every quiet full run it names agrees on (§5, §7): each holds in
    the cited run and in every earlier run the template names (claims about how the cited run
    was made, in it alone), and the claims over all the runs hold over all of them."""
    names = _also_runs()
    assert len(names) >= 2 and _cited().name not in names and len(set(names)) == len(names)
    others = [(json.loads((paper.DATA / name).read_text()), name) for name in names]
    for name, claim in paper.CLAIMS.items():
        assert claim(raw)[0], f"{name} does not hold in {_cited().name}"
        for other, other_name in others:
            assert name in paper.ABOUT_THE_RUN or claim(other)[0], f"{name} does not hold in {other_name}"
    runs = [(raw, _cited().name), *others]
    assert all(claim(runs)[0] for claim in paper.ACROSS_RUNS.values())


def test_the_runs_disagree_on_the_criterion_first_stated_for_goal_1(raw: dict[str, Any]) -> None:
    """``const_intervals_disagree`` is judged over all the runs at once: it needs one run whose
    `const` intervals all overlap and one where two do not; a template that checks it against
    one run, or runs that all agree, stops the render and names every run."""
    overlapping, apart = copy.deepcopy(raw), copy.deepcopy(raw)
    _overlapping_const(overlapping)
    _overlapping_const(apart)
    row = _row(apart, regime="const", n=10000, strategy="continuation")
    row["in_process_s"] = [x * 3 for x in row["in_process_s"]]  # N = 10,000 apart from the rest
    claim = paper.ACROSS_RUNS["const_intervals_disagree"]
    assert claim([(apart, "a.json"), (overlapping, "b.json")])[0]
    assert not claim([(apart, "a.json"), (copy.deepcopy(apart), "b.json")])[0]
    assert not claim([(overlapping, "a.json"), (copy.deepcopy(overlapping), "b.json")])[0]
    for one in (apart, overlapping):
        with pytest.raises(paper.PaperError, match=r"tcc\.in\.md:1: the claim 'const_intervals_disagree' does not "
                                                   r"hold across cited\.json \(cited\.json: "):
            paper.fill("{{ check: const_intervals_disagree }}", one, "cited.json")


def _delta_grow_100(raw: dict[str, Any], factor: float) -> dict[str, Any]:
    """A copy of ``raw`` whose DeltaChannel step in `grow` at N = 100 is continuation's times
    ``factor``."""
    out = copy.deepcopy(raw)
    cont = _step(out, system="tcc continuation", regime="grow", n=100)
    _step(out, system="langgraph delta", regime="grow", n=100)["mean_step_s"] = [
        x * factor for x in cont["mean_step_s"]]
    return out


def test_the_runs_disagree_on_the_step_against_deltachannel_in_grow_at_100(raw: dict[str, Any]) -> None:
    """``delta_grow_100_disagree`` needs a run in which continuation's step is called cheaper
    than the delta saver's there and one in which it is not; runs that agree stop the render."""
    claim = paper.ACROSS_RUNS["delta_grow_100_disagree"]
    cheaper, same, dearer = (_delta_grow_100(raw, f) for f in (2.0, 1.0, 0.5))
    assert claim([(cheaper, "a.json"), (same, "b.json")])[0]
    assert claim([(dearer, "a.json"), (cheaper, "b.json")])[0]
    assert not claim([(cheaper, "a.json"), (copy.deepcopy(cheaper), "b.json")])[0]
    assert not claim([(same, "a.json"), (dearer, "b.json")])[0]
    with pytest.raises(paper.PaperError, match=r"the claim 'delta_grow_100_disagree' does not hold across "
                                               r"cited\.json \(cited\.json: "):
        paper.fill("{{ check: delta_grow_100_disagree }}", same, "cited.json")


def test_a_claim_must_also_hold_in_every_earlier_run_the_template_names(
        raw: dict[str, Any], tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``{{ also: FILE }}`` names a committed full run in which every claim must hold too: a
    run in which const recovery at N = 10,000 took twice as long makes const_flat false there,
    so naming it stops the render, once, and says where and in which run."""
    monkeypatch.setattr(paper, "DATA", tmp_path)
    unflat = copy.deepcopy(raw)
    _unflat(unflat)
    (tmp_path / "unflat.json").write_text(json.dumps(unflat))
    assert paper.CLAIMS["const_flat"](raw)[0]
    both = "checked against {{ also: unflat.json }}{{ check: state_grows }}"
    assert paper.fill(both, raw, "cited.json") == "checked against unflat.json"
    with pytest.raises(paper.PaperError) as info:
        paper.fill("{{ also: unflat.json }}\nflat.{{ check: const_flat }}{{ also: unflat.json }}",
                   raw, "cited.json")  # named twice: said once
    said = str(info.value)
    assert said.count("tcc.in.md:2: the claim 'const_flat' does not hold in unflat.json") == 1
    assert "does not hold in cited.json" not in said  # it holds in the run the figures are from
    # without the also:, the same template renders from the cited run alone
    assert paper.fill("flat.{{ check: const_flat }}", raw, "cited.json") == "flat."


def test_an_also_run_is_not_judged_by_the_claims_about_the_rendered_run(
        raw: dict[str, Any], tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``quiet_machine`` says how the rendered run was made; an earlier run that overlapped
    with other work does not make it false (its results claims are still judged)."""
    monkeypatch.setattr(paper, "DATA", tmp_path)
    busy = copy.deepcopy(raw)
    busy["provenance"]["loadavg_after"] = [float(raw["cpus"]) + 1, 0.0, 0.0]
    assert not paper.CLAIMS["quiet_machine"](busy)[0]
    (tmp_path / "busy.json").write_text(json.dumps(busy))
    assert paper.fill("{{ also: busy.json }}{{ check: quiet_machine }}", raw, "x.json") == "busy.json"
    with pytest.raises(paper.PaperError, match="does not hold in x.json"):
        paper.fill("{{ also: busy.json }}{{ check: quiet_machine }}", busy, "x.json")
    _slower_langgraph(busy)
    (tmp_path / "busy.json").write_text(json.dumps(busy))
    with pytest.raises(paper.PaperError, match="'langgraph_faster_in_process' does not hold in busy.json"):
        paper.fill("{{ also: busy.json }}{{ check: langgraph_faster_in_process }}", raw, "x.json")


def test_an_also_that_names_no_committed_full_run_stops_the_render(
        raw: dict[str, Any], tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "data"
    data.mkdir()
    monkeypatch.setattr(paper, "DATA", data)
    (tmp_path / "escape.json").write_text(json.dumps(raw))  # a full run, outside paper/data/
    (data / "quick.json").write_text(json.dumps({"profile": "quick"}))
    (data / "torn.json").write_text('{"profile": "fu')
    for name, said in [("missing.json", "names no raw file in paper/data/"),
                       ("../escape.json", "names no raw file in paper/data/"),
                       ("quick.json", "is not a full run's raw file"),
                       ("torn.json", "cannot be read")]:
        with pytest.raises(paper.PaperError, match=re.escape(said)):
            paper.fill(f"{{{{ also: {name} }}}}", raw, "x.json")


# Figures §5-§6 may state by hand: those of earlier raw files they name (to say what changed),
# and the size of a message of §3's corpus.  Every other one is a placeholder.
_BY_HAND = {
    "1.1",  # the in-process ratio to LangGraph an earlier version of §5 called "met"
    "1,232",  # the work N = 10,000 ratio against replay it quoted (recovery-full-20261130-233257)
    "1.7",  # ~1.7 KB per message (§3)
    "1,000", "10,000",  # history lengths N
}


def test_no_figure_of_the_results_is_typed_into_the_template() -> None:
    template = paper.TEMPLATE.read_text()
    sections = template[template.index("## 5. Results"):template.index("## 7. Threats to validity")]
    outside = re.sub(r"\{\{.*?\}\}", "", sections, flags=re.S)
    figures = re.findall(r"(?<![\w.,])\d{1,3}(?:,\d{3})*(?:\.\d+)?(?![\d.])", outside)
    typed = sorted({f for f in figures if ("." in f or "," in f) and f not in _BY_HAND})
    assert typed == [], f"figures typed into §5-§6 of paper/tcc.in.md instead of placeholders: {typed}"
    assert len(re.findall(r"\{\{\s*[\w./]+\s*\}\}", sections)) > 100  # they are placeholders
    assert not re.search(r"\d\.\d\d", outside)


def test_a_full_render_writes_the_paper_and_keeps_it_when_a_claim_fails(
        raw: dict[str, Any], tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(report, "GENERATED", tmp_path / "generated")
    monkeypatch.setattr(report, "BENCH_README", tmp_path / "README.md")
    monkeypatch.setattr(paper, "PAPER", tmp_path / "tcc.md")
    monkeypatch.setattr(paper, "DATA", tmp_path / "data")
    monkeypatch.setattr(report, "figures", lambda *args: [])  # no PNGs: not what is tested here
    (tmp_path / "data").mkdir()
    for name in _also_runs():  # the runs the template checks its claims against too
        (tmp_path / "data" / name).write_bytes((ROOT / "paper" / "data" / name).read_bytes())
    src = tmp_path / "recovery-full-1.json"
    src.write_text(json.dumps(raw))

    assert report.main([str(src)]) == 0
    assert (tmp_path / "tcc.md").read_text() == paper.paper_text(raw, src.name)
    assert (tmp_path / "data" / src.name).read_bytes() == src.read_bytes()  # where the paper cites it
    assert (tmp_path / "generated" / "results.md").exists()

    broken = copy.deepcopy(raw)
    _slower_langgraph(broken)
    src2 = tmp_path / "recovery-full-2.json"
    src2.write_text(json.dumps(broken))
    before = (tmp_path / "tcc.md").read_text()
    assert report.main([str(src2)]) == 1
    assert "langgraph_faster_in_process" in capsys.readouterr().err
    assert (tmp_path / "tcc.md").read_text() == before  # the false sentence is not published

    quick = copy.deepcopy(raw)
    quick["profile"] = "quick"
    src3 = tmp_path / "recovery-quick-3.json"
    src3.write_text(json.dumps(quick))
    assert report.main([str(src3)]) == 0
    assert (tmp_path / "tcc.md").read_text() == before and not (tmp_path / "data" / src3.name).exists()
