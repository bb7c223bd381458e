"""The crash-every-step checker over agents whose patterns must resume exactly as they ran (issue 17).

Each agent is run uninterrupted, then SIGKILLed after each of its journaled steps in turn and
resumed; the resumed outcome must equal the uninterrupted one, with no effect call completed
twice (tcc.testing.check_crash_every_step).
"""

from __future__ import annotations

import pytest

import tcc.testing
from tests._support.runs import AGENTS

QUIET = AGENTS / "quiet"
STRATEGIES = [("continuation", None), ("hybrid", 2), ("replay", None)]


@pytest.mark.parametrize("strategy,every", STRATEGIES, ids=[s for s, _ in STRATEGIES])
def test_module_globals_agent_survives_a_crash_at_every_step(strategy, every):
    """Point 2: module-level state of the script and of its neighbour module."""
    report = tcc.testing.check_crash_every_step(str(QUIET / "globals_agent.py"), strategy=strategy,
                                                checkpoint_every=every)
    report.raise_for_mismatch()
    assert report.expected.result == [6, 6, 150, True, 6] and report.steps == 6


@pytest.mark.parametrize("strategy,every", STRATEGIES, ids=[s for s, _ in STRATEGIES])
def test_argument_mutating_agent_survives_a_crash_at_every_step(strategy, every):
    """Point 3: an effect that appends to the list it was passed."""
    report = tcc.testing.check_crash_every_step(str(QUIET / "mutating_agent.py"), strategy=strategy,
                                                checkpoint_every=every)
    report.raise_for_mismatch()
    assert report.expected.result == [[3, 4, 5, 6], ["system", "user 0", "user 1", "user 2", "user 3"]]


def test_forgotten_await_agent_fails_the_same_way_after_every_crash():
    """Point 1: the run fails with the same UnawaitedEffectError, crashed or not."""
    report = tcc.testing.check_crash_every_step(str(QUIET / "forgetful_agent.py"))
    report.raise_for_mismatch()
    assert report.expected.status == "failed" and "was not awaited before the agent's next await" in str(report.expected)


@pytest.mark.parametrize("strategy,every", STRATEGIES, ids=[s for s, _ in STRATEGIES])
def test_replayed_loop_and_answer_agents_survive_a_crash_at_every_step(strategy, every):
    """Points 4 and 6: a loop of calls served from the journal, and frames that store answers."""
    for script in ("edited_agent.py", "answer_agent.py"):
        report = tcc.testing.check_crash_every_step(str(QUIET / script), strategy=strategy,
                                                    checkpoint_every=every)
        report.raise_for_mismatch()
        assert report.expected.status == "completed", script
