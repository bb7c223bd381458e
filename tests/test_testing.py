"""tcc.testing: agents run in-process without the runtime, and the crash-every-step checker.

The checker tests start real ``python -m tcc run`` / ``resume`` processes (each
SIGKILLs itself through the driver's ``TCC_TEST_KILL_AFTER`` hook); nothing is
mocked.  Examples whose files are not agents are listed with the reason.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

import tcc
import tcc.testing
from tcc import errors
from tcc.testing import MissingAnswerError, sequence

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"

# Every file in examples/ and what the checker does with it (a new example must be added here).
EXAMPLE_FILES = {
    "research_agent.py": "agent: offline, fake model and tools",
    "openai_agent.py": "agent: needs examples/openai_stub.py serving (started in this process)",
    "openai_stub.py": "not an agent: the stub HTTP server openai_agent.py talks to",
    # A demo script whose `main` starts `tcc run`/`tcc resume` subprocesses itself and kills
    # them: running it *as* an agent would nest runs, and what it exercises is covered below.
    "crash_and_resume.py": "not an agent: the quick start's crash demo, it drives tcc itself",
    # Drives its own coroutine with tcc.dumps/tcc.loads and awaits its own `Ask` objects,
    # which a tcc run refuses (only tcc effects may be awaited): a capture demo, not an agent.
    "resume_demo.py": "not an agent: drives its coroutine with tcc.dumps/loads by hand",
}

TOUR = '''
"""Every kind of journaled step: sync and async effects, gather, spawn, sleep, checkpoint."""
import asyncio

import tcc


@tcc.effect
def shout(text):
    return text.upper()


@tcc.effect
async def whisper(text):
    await asyncio.sleep(0)
    return text.lower()


@tcc.effect
def key():
    return tcc.current().idempotency_key


async def child(label, n):
    return [await shout(f"{label}{i}") for i in range(int(n))]


async def helper(word):
    return await whisper(word) + "!"


async def main(word="Mixed"):
    loud = await shout(word)
    quiet = await helper(word)
    both = await tcc.gather(shout(word + "-a"), whisper(word + "-B"))
    await tcc.checkpoint()
    kids = await tcc.spawn(child, "kid", 2)
    await tcc.sleep(0.01)
    return {"loud": loud, "quiet": quiet, "both": both, "kids": kids, "key": await key()}
'''

WAITS = '''
"""Parks twice: for an approval, then for a signal."""
import tcc


@tcc.effect
def act(what):
    return f"did {what}"


async def main():
    first = await act("prepare")
    ok = await tcc.approval("Ship it?")
    note = await tcc.wait_for("note")
    return [first, ok, note, await act(f"ship {note}" if ok else "hold")]
'''

PID = '''
"""Compares its process id before and after its effects, outside any effect."""
import os

import tcc


@tcc.effect
def step(i):
    return i


async def main():
    first = os.getpid()  # a local: the snapshot keeps the value of the process that is gone
    total = 0
    for i in range(3):
        total += await step(i)
    return {"total": total, "same_process": os.getpid() == first}
'''

APPEND = '''
"""Appends to a file between its effects, outside any effect."""
import os

import tcc


@tcc.effect
def step(i):
    return i


def note(path, line):
    with open(path, "a") as fh:
        fh.write(line + "\\n")


async def main(folder):
    path = os.path.join(folder, tcc.current().run_id + ".log")
    for i in range(3):
        note(path, str(i))  # not an effect: executed again when the run is replayed
        await step(i)
    with open(path) as fh:
        return fh.read().split()
'''


@pytest.fixture(scope="module")
def agents(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """The agent scripts above, written once (run_script loads each name once per process)."""
    folder = tmp_path_factory.mktemp("agents")
    for name, text in (("tt_tour.py", TOUR), ("tt_waits.py", WAITS), ("tt_pid.py", PID),
                       ("tt_append.py", APPEND)):
        (folder / name).write_text(textwrap.dedent(text))
    return folder


def tcc_run(*args: str, env: dict[str, str] | None = None) -> dict:
    proc = subprocess.run([sys.executable, "-m", "tcc", "run", "--json", *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


# ------------------------------------------------------------------ in-process runs


@tcc.effect
def sync_double(x: int) -> int:
    return 2 * x


@tcc.effect
async def async_inc(x: int) -> int:
    await asyncio.sleep(0)
    return x + 1


ATTEMPTS: dict[str, int] = {}


@tcc.effect(retries=2, retry_delay=30)
def flaky(name: str) -> str:
    ATTEMPTS[name] = ATTEMPTS.get(name, 0) + 1
    if ATTEMPTS[name] < 3:
        raise ConnectionError(f"attempt {ATTEMPTS[name]}")
    return f"{name} after {ATTEMPTS[name]} attempts ({tcc.current().attempt})"


@tcc.effect
def broken() -> None:
    raise ValueError("no luck")


@tcc.effect(timeout=0.05)
async def too_slow() -> None:
    await asyncio.sleep(30)


async def mixed(x: int) -> dict:
    a = await sync_double(x)
    b = await async_inc(a)
    pair = await tcc.gather(sync_double(b), async_inc(b))
    await tcc.checkpoint()
    return {"a": a, "b": b, "pair": pair, "run": tcc.current().run_id}


def test_plain_asyncio_fails_where_testing_run_works():
    """asyncio.run cannot await a sync effect's plain value; tcc.testing.run drives the agent."""
    with pytest.raises(TypeError, match="can't be used in 'await' expression"):
        asyncio.run(mixed(3))
    assert tcc.testing.run(mixed, 3) == {"a": 6, "b": 7, "pair": [14, 8], "run": "test"}


def test_run_script_returns_what_tcc_run_returns(agents):
    """run_script on an agent with sync and async effects, gather, spawn and sleep gives tcc run's result."""
    script = str(agents / "tt_tour.py")
    real = tcc_run("--store", str(agents / "store-tour"), "--run-id", "tour-1", script, "MiXed")
    assert real["status"] == "completed"
    local = tcc.testing.run_script(script, "MiXed", run_id="tour-1")
    assert json.loads(json.dumps(local)) == real["result"]
    assert local == {"loud": "MIXED", "quiet": "mixed!", "both": ["MIXED-A", "mixed-b"],
                     "kids": ["KID0", "KID1"], "key": "tour-1:6"}


def test_run_retries_and_throws_effect_errors_into_the_agent():
    """retries are honoured without waiting retry_delay; a failed effect raises inside the agent."""
    ATTEMPTS.clear()

    async def agent() -> list:
        got = [await flaky("a")]
        try:
            await broken()
        except ValueError as exc:
            got.append(f"caught {exc}")
        try:
            await too_slow()
        except TimeoutError as exc:
            got.append(str(exc))
        return got

    got = tcc.testing.run(agent)
    assert got[:2] == ["a after 3 attempts (3)", "caught no luck"]
    assert "timed out after 0.05 s" in got[2]


def test_run_propagates_the_agents_exception():
    """An exception the agent does not catch comes out of run() as it is."""
    async def agent() -> None:
        await broken()

    with pytest.raises(ValueError, match="no luck"):
        tcc.testing.run(agent)


def test_run_answers_waits_and_approvals_and_skips_sleeps():
    """wait_for takes signals (sequence() for successive waits), approval takes approvals, sleep returns at once."""
    async def agent() -> list:
        await tcc.sleep(24 * 3600)
        first = await tcc.wait_for("note")
        second = await tcc.wait_for("note")
        ok = await tcc.approval("Deploy?")
        again = await tcc.approval("Really?")
        return [first, second, ok, again]

    got = tcc.testing.run(agent, signals={"note": sequence({"n": 1}, "two")}, approvals=[True, False])
    assert got == [{"n": 1}, "two", True, False]
    got = tcc.testing.run(agent, signals={"note": "same"}, approvals=lambda prompt: prompt == "Deploy?")
    assert got == ["same", "same", True, False]


def test_run_without_an_answer_raises_unless_the_wait_has_a_timeout():
    """A wait with no answer raises MissingAnswerError; with a timeout, TimeoutError inside the agent."""
    async def patient() -> str:
        return await tcc.wait_for("never")

    async def hasty() -> str:
        try:
            return await tcc.wait_for("never", timeout=5)
        except TimeoutError as exc:
            return f"gave up: {exc}"

    with pytest.raises(MissingAnswerError, match=r"wait_for\('never'\).*signals="):
        tcc.testing.run(patient)
    with pytest.raises(errors.UsageError, match="approvals="):
        tcc.testing.run(lambda: tcc.approval("ok?"))
    assert tcc.testing.run(hasty) == "gave up: no signal 'never@1' within 5 s"


async def spawned_child(n: int) -> list:
    return [await sync_double(i) for i in range(n)]


async def failing_child() -> None:
    await broken()


async def spawning_parent() -> list:
    kids = await tcc.spawn(spawned_child, 3)
    try:
        await tcc.spawn(failing_child)
    except errors.RunFailedError as exc:
        kids.append(str(exc))
    return kids


def test_run_refuses_a_forgotten_await_like_a_run():
    """An effect call the agent never awaits fails with UnawaitedEffectError, as under tcc run."""
    async def forgetful() -> object:
        value = sync_double(2)  # the request object, not 4
        await async_inc(1)
        return value

    with pytest.raises(errors.UnawaitedEffectError, match=r"sync_double\(\.\.\.\) at .*not awaited before"):
        tcc.testing.run(forgetful)


def test_run_spawns_children_in_process():
    """tcc.spawn runs the child to its end in-process; a failed child raises RunFailedError in the parent."""
    assert tcc.testing.run(spawning_parent) == [0, 2, 4, "child run test.2 failed: no luck"]


def test_fakes_replace_effect_functions():
    """fakes={effect: fn} runs fn instead of the effect's function, by effect or by name."""
    got = tcc.testing.run(mixed, 1, fakes={sync_double: lambda x: x * 10,
                                           async_inc.name: lambda x: -x})
    assert got == {"a": 10, "b": -10, "pair": [-100, 10], "run": "test"}


def test_plain_def_entry_runs_like_tcc_run():
    """A plain `def` entry calls effects without await (on a greenlet, as tcc run does)."""
    def sync_main(n: int) -> list:
        return [sync_double(i) for i in range(n)]

    assert tcc.testing.run(sync_main, 3) == [0, 2, 4]


def test_arun_inside_a_running_loop():
    """arun works inside an event loop, where run() refuses with a pointer to arun."""
    async def test_body() -> dict:
        with pytest.raises(RuntimeError, match="arun"):
            tcc.testing.run(mixed, 1)
        return await tcc.testing.arun(mixed, 1, run_id="loop")

    assert asyncio.run(test_body()) == {"a": 2, "b": 3, "pair": [6, 4], "run": "loop"}


# -------------------------------------------------------------- crash-every-step checker


def test_every_example_is_classified():
    """Each file in examples/ is listed above as an agent the checker runs, or why it is not one."""
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted(EXAMPLE_FILES)


@pytest.mark.parametrize("strategy,every", [("continuation", None), ("hybrid", 2), ("replay", None)])
def test_research_agent_survives_a_crash_at_every_step(strategy, every):
    """examples/research_agent.py killed after each of its 6 steps resumes to the uninterrupted result."""
    report = tcc.testing.check_crash_every_step(str(EXAMPLES / "research_agent.py"), "durable agents",
                                                strategy=strategy, checkpoint_every=every)
    report.raise_for_mismatch()
    assert report.steps == 6 and len(report.results) == 6
    assert all(r.killed and r.reached for r in report.results)
    assert report.expected.status == "completed" and report.expected.result["topic"] == "durable agents"


def load_stub():
    spec = importlib.util.spec_from_file_location("openai_stub_for_checker", EXAMPLES / "openai_stub.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Importing openai makes each tcc process ~3x slower than research_agent's; the checker
# still crashes it after every one of its 5 steps under each strategy.
@pytest.mark.parametrize("strategy,every", [("continuation", None), ("hybrid", 2), ("replay", None)])
def test_openai_agent_survives_a_crash_at_every_step(tmp_path, strategy, every):
    """examples/openai_agent.py against the stub server resumes to the uninterrupted result after each crash."""
    pytest.importorskip("openai")
    with load_stub().StubServer(log=str(tmp_path / "stub.jsonl")) as stub:
        report = tcc.testing.check_crash_every_step(
            str(EXAMPLES / "openai_agent.py"), "durable execution", strategy=strategy,
            checkpoint_every=every, env={"OPENAI_BASE_URL": stub.base_url})
    report.raise_for_mismatch()
    assert report.steps == 5 and [r.step for r in report.results if r.killed] == [1, 2, 3, 4, 5]


def test_checker_covers_gather_spawn_and_sleep(agents):
    """The tour agent (gather, a spawned child, a sleep) survives a crash at each step, keys and all."""
    report = tcc.testing.assert_crash_safe(str(agents / "tt_tour.py"), "MiXed")
    assert report.steps == 6
    assert report.expected.result["key"] == "<run>:6"


def test_checker_answers_waits_and_crashes_later_processes(agents):
    """A run that parks twice is answered and resumed; crash points in each of its processes are checked."""
    report = tcc.testing.check_crash_every_step(str(agents / "tt_waits.py"), approvals=True,
                                                signals={"note": "v2"}, steps={1})
    report.raise_for_mismatch()
    assert report.expected.result == ["did prepare", True, "v2", "did ship v2"]
    assert report.segments == 3 and report.steps == 4
    # the first step of `tcc run` (act), of the resume that gets the approval, and of the
    # resume that gets the signal
    assert [(r.segment, r.step, r.killed) for r in report.results] == [
        (0, 1, True), (1, 1, True), (2, 1, True)]


def test_checker_reports_a_run_still_waiting(agents):
    """Without an answer the run ends waiting, in the uninterrupted run and after a crash alike."""
    report = tcc.testing.check_crash_every_step(str(agents / "tt_waits.py"))
    report.raise_for_mismatch()
    assert report.expected.status == "waiting"
    assert report.expected.waiting_for == ("<run> approval@1",)
    assert [(r.step, r.killed) for r in report.results] == [(1, True)]


def test_checker_refuses_a_check_with_no_step_to_crash(agents, tmp_path):
    """An agent that asks for an approval before any effect, checked without an answer, used to
    pass with nothing checked (a test that cannot fail): the check is refused and says how to
    answer the wait.  A run that stops at a wait after some steps is checked up to it, and the
    report says the rest was not."""
    script = tmp_path / "ask_first.py"
    script.write_text("import tcc\n\n\n@tcc.effect\ndef act(what):\n    return what\n\n\n"
                      "async def main():\n    ok = await tcc.approval('Go?')\n"
                      "    return await act('go' if ok else 'stop')\n")
    with pytest.raises(tcc.errors.UsageError) as caught:
        tcc.testing.check_crash_every_step(str(script))
    message = str(caught.value)
    assert "made no journaled step before it stopped, waiting for <run> approval@1" in message, message
    assert "approvals=True" in message and "nothing would be checked" in message, message
    report = tcc.testing.check_crash_every_step(str(script), approvals=True)
    report.raise_for_mismatch()
    assert report.expected.result == "go" and report.steps == 2  # the approval, then act
    partial = tcc.testing.check_crash_every_step(str(agents / "tt_waits.py"))
    assert "checked up to that wait only" in str(partial), str(partial)
    pure = tmp_path / "pure.py"  # no effect at all: nothing to crash, and nothing wrong
    pure.write_text("async def main():\n    return 3\n")
    report = tcc.testing.check_crash_every_step(str(pure))
    assert report.ok and report.steps == 0 and report.expected.result == 3


def test_checker_detects_state_that_no_snapshot_can_bring_back(agents):
    """A value read outside an effect (the process id) differs after a resume: a mismatch named by step."""
    report = tcc.testing.check_crash_every_step(str(agents / "tt_pid.py"))
    assert report.deterministic and not report.ok
    assert [r.step for r in report.failures] == [1, 2, 3]
    assert report.expected.result == {"total": 3, "same_process": True}
    with pytest.raises(AssertionError) as caught:
        report.raise_for_mismatch()
    message = str(caught.value)
    assert "crash after step 2" in message
    assert '"same_process": false' in message and '"same_process": true' in message


def test_checker_detects_work_repeated_by_replay(agents, tmp_path):
    """A file written outside an effect is written again on replay (a mismatch), but not by continuation."""
    replayed = tcc.testing.check_crash_every_step(str(agents / "tt_append.py"), str(tmp_path),
                                                  strategy="replay")
    assert [r.step for r in replayed.failures] == [1, 2, 3]
    assert replayed.failures[0].outcome is not None
    assert replayed.failures[0].outcome.result == ["0", "0", "1", "2"]
    continued = tcc.testing.check_crash_every_step(str(agents / "tt_append.py"), str(tmp_path),
                                                   steps={2})
    continued.raise_for_mismatch()


def test_checker_refuses_a_script_that_cannot_run(tmp_path):
    """A script tcc cannot run gives no outcome to compare with: UsageError with tcc's message."""
    with pytest.raises(errors.UsageError, match="does not exist"):
        tcc.testing.check_crash_every_step(str(tmp_path / "missing.py"))


def test_journal_scan_counts_steps_and_finds_calls_completed_twice(tmp_path):
    """A key with two successful completions is a duplicate; failed attempts and open intents are not."""
    from tcc.store import Completion, open_store
    from tcc.testing import _scan_journals

    with open_store(tmp_path / "store", durability="none") as store:
        run = store.create_run("agent.py:main", run_id="dup")
        for key, attempt, error in (("dup:1", 1, b"{}"), ("dup:1", 2, None), ("dup:2", 1, None),
                                    ("dup:2", 2, None), ("dup:3.0", 1, None)):
            seq = store.append_intent("dup", run.epoch, "m:f", b"", idempotency_key=key, attempt=attempt)
            store.append_completion("dup", run.epoch, Completion(seq, result=None if error else b"r",
                                                                 error=error))
        store.append_intent("dup", run.epoch, "tcc:wait", b"", idempotency_key="dup:4")  # parked
    assert _scan_journals(str(tmp_path / "store")) == (3, ["m:f (dup:2) completed 2 times"])


def test_run_gives_effects_copies_of_their_arguments_as_a_real_run_does():
    """An effect that appends to the list it was passed leaves the agent's list alone, as in `tcc run`."""
    import tcc

    @tcc.effect(name="tt-copy-append")
    def append_reply(messages):
        messages.append("reply")
        return len(messages)

    async def agent():
        messages = ["system"]
        sizes = [await append_reply(messages), await append_reply(messages)]
        return sizes, messages

    assert tcc.testing.run(agent) == ([2, 2], ["system"])


@tcc.effect(timeout=0.1)
def _slow_sync(seconds: float) -> str:
    import time

    time.sleep(seconds)
    return "done"


async def _calls_slow() -> list[str]:
    out = []
    for seconds in (0.0, 0.5, 0.0):
        try:
            out.append(await _slow_sync(seconds))
        except TimeoutError as exc:
            out.append(str(exc).split(" (")[0])
    return out


def test_in_process_run_bounds_a_sync_effect_by_its_timeout_as_a_run_does():
    """A sync effect's `timeout` fails the attempt in tcc.testing.run as in `tcc run` (it
    was not enforced in-process, so a test saw the call succeed)."""
    name = _slow_sync.public_name
    assert tcc.testing.run(_calls_slow) == ["done", f"effect {name!r} timed out after 0.1 s", "done"]


SHARED_RESULT = '''
import tcc

CONFIG = {"v": 1}


@tcc.effect
def cfg():
    return CONFIG


async def main():
    c = await cfg()
    c["v"] = 2
    again = await cfg()
    return {"same": c is CONFIG, "again": again["v"], "config": CONFIG["v"]}
'''


def test_run_gives_the_agent_a_copy_of_each_result_as_a_run_does(tmp_path):
    """An effect returning a module-level dict: `tcc run` hands the agent a copy (the journaled
    result, as after a crash), but `tcc.testing.run` handed it the object itself, so the
    agent's change leaked into the module and into later results, and a unit test saw
    something no run does.  Fakes are copied the same way."""
    script = tmp_path / "shared_result.py"
    script.write_text(SHARED_RESULT)
    expected = {"same": False, "again": 1, "config": 1}
    cli_out = subprocess.run([sys.executable, "-m", "tcc", "run", "--json", str(script)],
                             env=dict(os.environ, TCC_STORE=str(tmp_path / "store")),
                             capture_output=True, text=True, timeout=120)
    assert json.loads(cli_out.stdout)["result"] == expected, cli_out.stderr
    assert tcc.testing.run_script(str(script)) == expected
    shared = {"v": 1}
    spec = importlib.util.spec_from_file_location("shared_result_for_fakes", script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    got = tcc.testing.run(mod.main, fakes={mod.cfg: lambda: shared})
    assert got == {"same": False, "again": 1, "config": 1} and shared == {"v": 1}
