"""Smoke tests of the real-peer recovery benchmarks (benchmarks/peers): numbers and final results."""

from __future__ import annotations

import hashlib
import importlib
import math
import pathlib
import sys
from typing import Any

import pytest

peers = importlib.import_module("benchmarks.peers")

CASES = [("const", 0.0), ("grow", 0.2), ("mutate", 0.0)]


def independent_result(n: int) -> dict[str, object]:
    """The contract's final result, computed here without the benchmark's helpers."""
    joined = "|".join(f"out-{i}" for i in range(n))
    return {"n": n, "digest": hashlib.sha256(joined.encode()).hexdigest()[:16]}


def check_numbers(res: dict, *, peer: str, n: int, regime: str, work_ms: float) -> None:
    """Assert that one measure() result is complete, finite and consistent."""
    assert res["peer"] == peer and res["n"] == n
    assert res["regime"] == regime and res["work_ms"] == work_ms
    assert isinstance(res["version"], str) and res["version"]
    assert len(res["whole_process_s"]) == len(res["in_process_s"]) == res["repeats"]
    for whole, inproc in zip(res["whole_process_s"], res["in_process_s"]):
        assert 0 < inproc < whole < 600
    assert math.isfinite(res["per_step_overhead_s"])
    assert res["storage_bytes"] > 0 and res["storage_bytes_at_crash"] > 0
    assert res["final_result"] == independent_result(n)
    assert res["effect_executions"] == n and res["duplicate_effects"] == 0
    assert isinstance(res["notes"], str) and res["notes"]


@pytest.mark.parametrize("regime", ["const", "grow", "mutate"])
def test_agent_contract_final_result(regime: str) -> None:
    """The reference agent loop returns the independently computed final result."""
    agent = importlib.import_module("benchmarks.peers._agent")
    state = agent.initial_state(regime)
    for i in range(12):
        agent.busy_work(3)
        agent.advance(state, i, agent.fake_llm(i, regime))  # grow, mutate: the call returns the message
    assert agent.final_result(state, 12) == independent_result(12)
    assert peers.expected_result(12) == independent_result(12)
    if regime == "grow":  # real text, not padding: prose replies, every third a tool output
        entries = state["transcript"]
        assert [e["name"] for e in entries] == [f"out-{i}" for i in range(12)]
        assert [e["role"] for e in entries[:3]] == ["assistant", "assistant", "tool"]
        assert all(200 <= len(e["content"]) <= 8192 for e in entries)
        assert all(len(set(e["content"])) > 20 for e in entries)  # many distinct characters
        assert entries == [agent.transcript_entry(i, f"out-{i}") for i in range(12)]  # deterministic
    if regime == "mutate":
        assert sorted(state["memory"]) == sorted(f"slot-{i}" for i in range(agent.MEMORY_SLOTS) if i < 12)


def test_mutate_regime_detects_a_stale_slot() -> None:
    """The scratchpad is really read back: a slot left with an old message is a mismatch."""
    agent = importlib.import_module("benchmarks.peers._agent")
    n = agent.MEMORY_SLOTS + 4
    state = agent.initial_state("mutate")
    for i in range(n):
        agent.advance(state, i, agent.fake_llm(i, "mutate"))
    assert agent.final_result(state, n) == independent_result(n)
    state["memory"]["slot-1"] = agent.transcript_entry(1, "out-1")  # step 17 rewrote it
    assert agent.final_result(state, n)["digest"] == "MISMATCH"


def test_agent_contract_detects_a_wrong_output() -> None:
    """An out-of-order or wrong step output makes the final result a mismatch."""
    agent = importlib.import_module("benchmarks.peers._agent")
    state = agent.initial_state("const")
    agent.advance(state, 0, "out-0")
    agent.advance(state, 1, "out-7")
    assert agent.final_result(state, 2)["digest"] == "MISMATCH"


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize(("regime", "work_ms"), CASES)
def test_dbos_peer_smoke(tmp_path: pathlib.Path, regime: str, work_ms: float) -> None:
    """DBOS crashed at step n-1 and relaunched produces numbers and the contract's final result."""
    pytest.importorskip("dbos")
    from benchmarks.peers import dbos_peer

    assert dbos_peer.available()
    res = dbos_peer.measure(10, regime=regime, work_ms=work_ms, repeats=1, workdir=tmp_path)
    check_numbers(res, peer="dbos", n=10, regime=regime, work_ms=work_ms)
    parts = res["breakdown_s"]
    assert parts["queue_poll_wait_s"][0] > 0 and parts["replay_s"][0] > 0


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize(("regime", "work_ms"), CASES)
def test_langgraph_peer_smoke(tmp_path: pathlib.Path, regime: str, work_ms: float) -> None:
    """LangGraph crashed at step n-1 and resumed by invoke(None) produces numbers and the final result."""
    pytest.importorskip("langgraph")
    pytest.importorskip("langgraph.checkpoint.sqlite")
    from benchmarks.peers import langgraph_peer

    assert langgraph_peer.available()
    res = langgraph_peer.measure(10, regime=regime, work_ms=work_ms, repeats=1, workdir=tmp_path)
    check_numbers(res, peer="langgraph", n=10, regime=regime, work_ms=work_ms)
    assert res["breakdown_s"]["invoke_to_step_s"][0] > 0


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize(("regime", "snapshot_frequency"), [("grow", 100), ("grow", 4), ("mutate", 4)])
def test_langgraph_delta_peer_smoke(tmp_path: pathlib.Path, regime: str, snapshot_frequency: int) -> None:
    """LangGraph with a DeltaChannel, SIGKILLed at step n-1 and resumed in a fresh process,
    rebuilds its transcript or scratchpad from the stored writes (with snapshot_frequency 4,
    from a snapshot and the writes after it) and returns the contract's final result; no
    checkpoint holds the channel's whole value except those snapshots."""
    pytest.importorskip("langgraph.channels.delta")
    pytest.importorskip("langgraph.checkpoint.sqlite")
    import sqlite3

    from langgraph.checkpoint.serde.types import _DeltaSnapshot
    from langgraph.checkpoint.sqlite import SqliteSaver

    from benchmarks.peers import langgraph_peer

    variant = langgraph_peer.VARIANTS["langgraph delta"]  # (step_costs runs its measure_steps)
    assert variant.available()
    n, channel = 10, {"grow": "transcript", "mutate": "memory"}[regime]
    res = variant.measure(n, regime=regime, repeats=1, workdir=tmp_path, snapshot_frequency=snapshot_frequency)
    check_numbers(res, peer="langgraph delta", n=n, regime=regime, work_ms=0.0)
    assert "DeltaChannel" in res["notes"]

    # the store the crash, recovery and completion children shared
    conn = sqlite3.connect(tmp_path / f"langgraph delta-{regime}-n{n}-w0-r0" / "peer.sqlite")
    saver = SqliteSaver(conn)
    thread = {"configurable": {"thread_id": "tcc-bench-agent"}}
    stored = {t.metadata["step"]: t for t in saver.list(thread)}  # step k holds i == k
    assert sorted(stored) == list(range(-1, n + 1))  # the input's, the input applied, one per step
    snapshots = [i for i, t in stored.items() if channel in t.checkpoint["channel_values"]]
    assert all(isinstance(stored[i].checkpoint["channel_values"][channel], _DeltaSnapshot) for i in snapshots)
    assert len(snapshots) == (n + 1) // snapshot_frequency  # the input's write counts as one
    # the checkpoint the recoveries resumed from (after step n-2): seed + writes give its value
    history = saver.get_delta_channel_history(config=stored[n - 1].config, channels=[channel])[channel]
    assert ("seed" in history) == (snapshot_frequency < n)
    seed = history["seed"].value if "seed" in history else ([] if regime == "grow" else {})
    writes = [value for _, _, value in history["writes"]]
    if regime == "grow":
        rebuilt = seed + [m for w in writes for m in (w if isinstance(w, list) else [w])]
        assert [m["name"] for m in rebuilt] == [f"out-{i}" for i in range(n - 1)]
        # from the snapshot: the steps after it; without one: the input's write and n-1 steps
        assert (len(writes) < n - 1) if snapshot_frequency < n else (len(writes) == n)
    else:
        rebuilt = {**seed, **{k: v for w in writes for k, v in w.items()}}
        assert sorted(rebuilt) == sorted(f"slot-{i}" for i in range(n - 1))
        assert len(writes) < n - 1
    conn.close()


@pytest.mark.parametrize(("regime", "work_ms"), CASES)
def test_tcc_measured_as_a_peer(tmp_path: pathlib.Path, regime: str, work_ms: float) -> None:
    """tcc goes through the peers' own crash / recover / complete children: a real SIGKILL at
    step n-1, recovery in a fresh process, no completed step run twice, the exact result."""
    from benchmarks.peers import tcc_peer

    res = tcc_peer.measure(10, regime=regime, work_ms=work_ms, repeats=2, workdir=tmp_path)
    check_numbers(res, peer="tcc", n=10, regime=regime, work_ms=work_ms)
    parts = res["breakdown_s"]
    assert len(parts["open_s"]) == 2 and all(x > 0 for x in parts["resume_to_step_s"])
    # the store folder itself was measured (allocated blocks), at the crash and at the end
    assert res["storage_bytes_at_crash"] % 512 == 0 and res["storage_bytes"] % 512 == 0
    crashed = tmp_path / f"tcc-{regime}-n10-w{work_ms:g}-r1" / "store"
    assert (crashed / "data.mdb").exists()


def test_in_process_runs_of_the_benchmark_agent_leave_the_harness_alone(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The harness runs tcc in its own process for some sections.  The agent's snapshots then
    record the module-level data of the agent's folder only: not the harness's own globals,
    which a step would pickle too and a recovery would write back over the live harness
    (``benchmarks/agent/agent.py`` has a folder of its own for that)."""
    from benchmarks import recovery

    from tcc import runtime
    from tcc.runtime import _scripts
    from tcc.runtime._globals import ModuleState
    from tcc.store import open_store

    # another test's script named agent.py loads under the same module name: set it aside
    # (monkeypatch puts it back, and takes this test's agent out, whatever the outcome), as
    # sys.path, to which loading a script adds its folder
    monkeypatch.setitem(sys.modules, _scripts.module_name(recovery.AGENT), None)
    monkeypatch.delitem(sys.modules, _scripts.module_name(recovery.AGENT))
    monkeypatch.setattr(sys, "path", list(sys.path))
    agent = runtime.load_script(recovery.AGENT)
    state = ModuleState(agent)
    assert {m.__name__ for m in state._modules} == {agent.__name__}
    assert set(state.capture()) == {agent.__name__}
    with open_store(tmp_path / "store") as st:
        outcome = runtime.start(st, recovery.AGENT, ["5", "grow", "0"], strategy="continuation")
    assert outcome.status == "completed" and outcome.result == independent_result(5)


def test_a_step_run_times_every_prefix_size_in_one_crash_child(tmp_path: pathlib.Path) -> None:
    """``measure_steps`` runs one crash child to N and reads the smaller sizes off its way:
    each mark m is the time at the start of step m-1, so the elapsed times grow with m."""
    from benchmarks.peers import tcc_peer

    per_step = tcc_peer.measure_steps(12, marks=[7, 3], regime="grow", workdir=tmp_path / "run")
    assert sorted(per_step) == [3, 7, 12]
    elapsed = [(m - 1) * per_step[m] for m in (3, 7, 12)]  # t_m - t_begin
    assert 0 < elapsed[0] < elapsed[1] < elapsed[2] < 60
    assert not (tmp_path / "run").exists()  # the store is gone with the run
    for bad in ([12], [1], [13]):
        with pytest.raises(ValueError, match="marks must lie in"):
            tcc_peer.measure_steps(12, marks=bad, regime="grow", workdir=tmp_path / "bad")


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("name", ["dbos", "langgraph", "langgraph delta"])
def test_each_peers_crash_child_times_the_prefix_sizes(tmp_path: pathlib.Path, name: str) -> None:
    """The peers' children note the marks too, at the start of step m-1 (``step_run`` checks
    the effect log there, and at the kill)."""
    peer = next((mod for found, mod in importlib.import_module("benchmarks.recovery").installed_peers(
        lambda _msg: None, variants=True) if found == name), None)
    if peer is None:
        pytest.skip(f"{name} is not installed (pip install 'tcc[peers]')")
    per_step = peer.measure_steps(8, marks=[4], regime="grow", workdir=tmp_path / "run")
    assert sorted(per_step) == [4, 8] and 0 < 3 * per_step[4] < 7 * per_step[8] < 60


def test_a_step_run_refuses_marks_taken_at_the_wrong_step(tmp_path: pathlib.Path) -> None:
    """A child whose marks come one step late (the effect of step m-1 already logged) is
    caught by the effect log, not turned into a figure."""
    from benchmarks.peers import _harness

    late = tmp_path / "late_child.py"
    late.write_text("""if True:
        import json, os, signal, sys, time
        args = json.loads(sys.argv[1])
        fd = os.open(args["effects"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        marks = {"t_begin": time.time()}
        for i in range(args["n"]):
            if i in args["marks"]:  # should be i + 1
                marks[f"t_mark_{i}"] = time.time()
                marks[f"effects_at_{i}"] = os.fstat(fd).st_size
            if i == args["n"] - 1:
                with open(args["out"], "w") as f:
                    json.dump({**marks, "t_kill": time.time()}, f)
                os.kill(os.getpid(), signal.SIGKILL)
            os.write(fd, b"%d\\n" % i)
    """)
    with pytest.raises(RuntimeError, match="not at the start of step m-1"):
        _harness.step_run(late, n=6, regime="const", marks=[3], workdir=tmp_path / "run")
    right = tmp_path / "right_child.py"
    right.write_text(late.read_text().replace("if i in args", "if i + 1 in args").replace(
        'f"t_mark_{i}"', 'f"t_mark_{i + 1}"').replace('f"effects_at_{i}"', 'f"effects_at_{i + 1}"'))
    assert sorted(_harness.step_run(right, n=6, regime="const", marks=[3], workdir=tmp_path / "run")) == [3, 6]


def test_step_costs_give_every_size_of_a_regime_from_one_run_per_round(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One child per system, regime and round, to the regime's largest size (or the largest a
    system is measured at); each size's figure is the one that run gave at that size.  The
    children are stood in for by a function that encodes who was asked for what (the
    children themselves: the test above and ``benchmarks.recovery --smoke`` in CI)."""
    import types

    from benchmarks import recovery
    from benchmarks.peers import tcc_peer

    calls: list[tuple[str, int, tuple[int, ...], str]] = []
    code = {"continuation": 1, "replay": 2, "other": 3}

    def fake(who: str) -> Any:
        def measure_steps(n: int, *, marks: list[int], regime: str, workdir: pathlib.Path,
                          strategy: str = "") -> dict[int, float]:
            calls.append((strategy or who, n, tuple(sorted(marks)), regime))
            return {m: code[strategy or who] + m / 100 + n / 1e5 for m in [*marks, n]}
        return measure_steps

    monkeypatch.setattr(recovery, "installed_peers",
                        lambda log, variants=False: [("other", types.SimpleNamespace(measure_steps=fake("other")))])
    monkeypatch.setattr(tcc_peer, "measure_steps", fake(""))
    monkeypatch.setattr(recovery, "STEP_COST_MAX_N", {("other", "grow"): 6})
    profile = {"step_plan": {"grow": [8, 4, 4], "const": [8]}, "step_repeats": 2, "repeats": 5}
    rows = recovery.step_costs(profile, tmp_path, lambda _msg: None)

    got = {(r["regime"], r["n"], r["system"]): r for r in rows}
    systems = {"tcc continuation": "continuation", "tcc replay": "replay", "other": "other"}
    assert set(got) == ({("grow", n, s) for n in (4, 8) for s in systems} - {("grow", 8, "other")}
                        | {("const", 8, s) for s in systems})
    for (regime, n, system), row in got.items():
        top = 4 if (regime, system) == ("grow", "other") else 8
        assert row["run_n"] == top
        assert row["mean_step_s"] == 2 * [code[systems[system]] + n / 100 + top / 1e5], (regime, n, system)
    # 2 rounds x (grow: 3 systems + const: 3 systems), not one child per size
    assert sorted(calls) == sorted(2 * [("continuation", 8, (4,), "grow"), ("replay", 8, (4,), "grow"),
                                        ("other", 4, (), "grow"), ("continuation", 8, (), "const"),
                                        ("replay", 8, (), "const"), ("other", 8, (), "const")])
    with pytest.raises(ValueError, match="at least 2 steps"):
        recovery.step_plan({"step_plan": {"grow": [1, 8]}})


def test_the_steady_state_reads_each_size_off_the_regimes_largest_run(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A size N is the median of the last steps before step N of the regime's longest run
    (the last half of them, at most 100), one figure per round.  The runs' intervals are
    stood in for by 1, 2, 3, ... seconds, so the medians say which intervals were taken."""
    from benchmarks import recovery

    from tcc.runtime import _scripts

    monkeypatch.setitem(sys.modules, _scripts.module_name(recovery.AGENT), None)  # as above
    monkeypatch.delitem(sys.modules, _scripts.module_name(recovery.AGENT))
    monkeypatch.setattr(sys, "path", list(sys.path))
    runs: list[tuple[int, str, str]] = []

    def gaps(agent: object, folder: pathlib.Path, n: int, regime: str, strategy: str) -> list[float]:
        runs.append((n, regime, strategy))
        return [float(k) for k in range(1, n)]  # a run of n steps has n - 1 intervals

    monkeypatch.setattr(recovery, "step_gaps", gaps)
    profile = {"steady_plan": {"grow": [12, 6, 300]}, "repeats": 2, "held_bytes": 1 << 10}
    rows = recovery.steady_state(profile, tmp_path, lambda _msg: None)
    got = {(r["kind"], r["n"], r["strategy"], r["regime"]): r for r in rows}
    assert set(got) == {("grow", n, s, "grow") for n in (6, 12, 300) for s in ("continuation", "replay")} | {
        ("hold", 6, "continuation", "hold:1024"), ("hold", 6, "continuation", "const")}
    for strategy in ("continuation", "replay"):
        # 6: intervals 1..5, the last 2 -> 4.5; 12: 1..11, the last 5 -> 9; 300: 1..299, the last 100
        assert [got[("grow", n, strategy, "grow")]["step_s"] for n in (6, 12, 300)] == [
            [4.5, 4.5], [9.0, 9.0], [249.5, 249.5]]
        assert got[("grow", 6, strategy, "grow")]["run_n"] == 300
    assert got[("hold", 6, "continuation", "const")]["step_s"] == [4.5, 4.5]
    assert sorted(runs) == sorted(2 * [(300, "grow", "continuation"), (300, "grow", "replay"),
                                       (6, "hold:1024", "continuation"), (6, "const", "continuation")])
