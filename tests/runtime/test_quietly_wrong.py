"""A resumed run gives what an uninterrupted run gives, or tcc says why not (issue 17, 1-6, 8).

Each crash here is a real SIGKILL: ``TCC_TEST_KILL_AFTER=K`` makes the `tcc run` process kill
itself right after it committed its K-th journaled step, or the effect kills its own process
while the call is in flight.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys
from typing import Any

import pytest
from tests._support import ROOT
from tests._support.runs import AGENTS, Cli

QUIET = AGENTS / "quiet"
EXAMPLES = ROOT / "examples"


def _result(proc):
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["result"]


def _killed_then_resumed(cli, run_id, script, *args, after, options=(), resume_options=()):
    """Run with a SIGKILL after step ``after``, then resume; the resumed result."""
    killer = Cli.__new__(Cli)
    killer.store, killer.env = cli.store, dict(cli.env, TCC_TEST_KILL_AFTER=str(after))
    proc = killer.run("run", "--json", "--run-id", run_id, *options, script, *args)
    assert proc.returncode == -9, (proc.returncode, proc.stderr)  # really killed
    assert cli.show(run_id)["status"] == "running"
    return _result(cli.run("resume", "--json", *resume_options, run_id))


# ------------------------------------------------------------------ 1: a forgotten await

def test_an_effect_call_never_awaited_fails_the_run_naming_the_line(tmp_path):
    """`y = step(2)` without await fails the run with file:line; no request reaches a result."""
    cli = Cli(tmp_path)
    script = QUIET / "forgetful_agent.py"
    proc = cli.run("run", "--json", "--run-id", "f", str(script))
    assert proc.returncode == 1
    doc = json.loads(proc.stdout)
    assert doc["status"] == "failed" and doc["result"] is None
    assert f"step(...) at {script}:13 was not awaited before the agent's next await" in doc["error"]
    assert "UnawaitedEffectError" in doc["error"] and "<effect" not in proc.stdout
    shown = cli.show("f")
    assert shown["status"] == "failed" and shown["result"] is None


def test_a_tcc_sleep_never_awaited_fails_the_run(tmp_path):
    """`tcc.sleep(0)` without await is named as such, with its line."""
    cli = Cli(tmp_path)
    script = QUIET / "forgetful_agent.py"
    proc = cli.run("run", "--json", f"{script}:sleeper")
    assert proc.returncode == 1
    assert f"tcc.sleep(...) at {script}:19 was not awaited before the agent's next await" in json.loads(proc.stdout)["error"]


def test_a_request_awaited_later_in_the_same_step_or_gathered_is_fine(tmp_path):
    """A request awaited before the next await, and effect calls given to tcc.gather, pass."""
    cli = Cli(tmp_path)
    proc = cli.run("run", "--json", f"{QUIET / 'forgetful_agent.py'}:late_but_fine")
    assert _result(proc) == [1, [2, 3]]


# ------------------------------------------------------------------ 2: module-level state

def test_module_globals_survive_a_crash_and_resume(tmp_path):
    """Globals of the script and of a module next to it resume with their values, shared with locals."""
    cli = Cli(tmp_path)
    script = str(QUIET / "globals_agent.py")
    expected = [6, 6, 150, True, 6]
    assert _result(cli.run("run", "--json", script)) == expected
    for after in (1, 3, 5):
        assert _killed_then_resumed(cli, f"g{after}", script, after=after) == expected


def test_an_uncapturable_module_level_object_is_named_at_start(tmp_path):
    """The lock left to the import is named in a note and in the started event."""
    cli = Cli(tmp_path)
    proc = cli.run("run", "--run-id", "n", str(QUIET / "globals_agent.py"), check=True)
    assert "tcc: note: module-level LOCK (_thread.lock) of globals_agent.py cannot be captured" in proc.stderr
    started = next(e for e in cli.show("n")["events"] if e["kind"] == "started")
    assert started["data"]["rebuilt_by_import"] == ["LOCK (_thread.lock) of globals_agent.py"]


def test_module_globals_survive_the_hybrid_strategy(tmp_path):
    """Restored from a snapshot every 4 steps, then the journal tail re-executes the rest."""
    cli = Cli(tmp_path)
    script = str(QUIET / "globals_agent.py")
    got = _killed_then_resumed(cli, "h", script, after=5, options=("--strategy", "hybrid",
                                                                    "--checkpoint-every", "4"))
    assert got == [6, 6, 150, True, 6]


def test_a_global_rebound_to_an_uncapturable_value_fails_naming_it(tmp_path):
    """Rebinding a global to a lock fails the checkpoint with the global's name."""
    cli = Cli(tmp_path)
    proc = cli.run("run", f"{QUIET / 'globals_agent.py'}:rebinds")
    assert proc.returncode == 1
    assert "module-level 'LOCK' of globals_agent.py cannot be captured" in proc.stderr


# ------------------------------------------------------------ 3: effects mutating arguments

EXPECTED_CHAT = [[3, 4, 5, 6], ["system", "user 0", "user 1", "user 2", "user 3"]]


def test_an_effect_gets_a_copy_of_its_arguments_on_a_live_call(tmp_path):
    """Only the return value reaches the agent: its list is not mutated by the effect."""
    cli = Cli(tmp_path)
    assert _result(cli.run("run", "--json", str(QUIET / "mutating_agent.py"))) == EXPECTED_CHAT


@pytest.mark.parametrize("options", [(), ("--strategy", "hybrid", "--checkpoint-every", "3"),
                                     ("--strategy", "replay")], ids=["continuation", "hybrid", "replay"])
def test_an_argument_mutating_effect_resumes_to_the_same_result(tmp_path, options):
    """After a kill at every step, resume gives the uninterrupted result on every strategy."""
    cli = Cli(tmp_path)
    script = str(QUIET / "mutating_agent.py")
    for after in (1, 2, 3):
        got = _killed_then_resumed(cli, f"m{after}", script, after=after, options=options)
        assert got == EXPECTED_CHAT, after


def test_a_reissued_call_of_a_mutating_effect_gives_the_same_result(tmp_path):
    """A call killed in flight is re-issued with its recorded arguments; the result is unchanged."""
    cli = Cli(tmp_path, KILL_IN_CALL="2", MARK=str(tmp_path / "mark"))
    proc = cli.run("run", "--json", "--run-id", "r", str(QUIET / "mutating_agent.py"))
    assert proc.returncode == -9
    proc = cli.run("resume", "--json", "r")
    assert _result(proc) == EXPECTED_CHAT
    assert "warning" not in proc.stderr  # the code computes the recorded arguments again
    kinds = [e["kind"] for e in cli.show("r")["events"]]
    assert "in_doubt_reissued" in kinds and "in_doubt_arguments_differ" not in kinds


def test_a_reissued_call_whose_arguments_the_code_computes_anew_is_said(tmp_path):
    """The resumed code computes another argument (a random id) for the call that was in
    flight: it is re-issued as recorded, and the run says that the agent's value differs
    (a warning naming both calls and the line, and an event), instead of going on quietly."""
    cli = Cli(tmp_path)
    script = str(QUIET / "recomputed_agent.py")
    assert _result(cli.run("run", "--json", script)) is True
    cli = Cli(tmp_path, KILL_IN_CALL="1", MARK=str(tmp_path / "mark"))
    assert cli.run("run", "--json", "--run-id", "r", script).returncode == -9
    proc = cli.run("resume", "--json", "r")
    assert _result(proc) is False  # the id the agent holds is not the one the call used
    line = next(n for n, text in enumerate(pathlib.Path(script).read_text().splitlines(), 1)
                if "await create_order(" in text)
    assert f"tcc: warning: run r: call 2 at {script}:{line} was in flight at the crash as create_order('" \
        in proc.stderr
    assert "; the resumed code now makes it as create_order('" in proc.stderr
    (event,) = [e for e in cli.show("r")["events"] if e["kind"] == "in_doubt_arguments_differ"]
    assert event["data"]["call"] == "call 2" and event["data"]["now"] != event["data"]["then"]


def test_gathered_calls_get_copies_too(tmp_path):
    """Two gathered calls each see the list as the agent passed it."""
    cli = Cli(tmp_path)
    assert _result(cli.run("run", "--json", f"{QUIET / 'mutating_agent.py'}:gathered")) == [[2, 2], ["system"]]


# ------------------------------------------------------------ 4: replay after an edit

def test_replay_after_an_edit_that_changes_arguments_is_a_divergence(tmp_path):
    """`step(i)` edited to `step(i * 10)`: replay refuses, naming the call, line and both calls."""
    cli = Cli(tmp_path)
    script = tmp_path / "edited.py"
    shutil.copy(QUIET / "edited_agent.py", script)
    killer = Cli.__new__(Cli)
    killer.store, killer.env = cli.store, dict(cli.env, TCC_TEST_KILL_AFTER="4")
    assert killer.run("run", "--run-id", "e", str(script)).returncode == -9
    script.write_text(script.read_text().replace("FACTOR = 1", "FACTOR = 10"))
    proc = cli.run("resume", "--strategy", "replay", "e")
    assert proc.returncode == 1
    assert f"call 2 at {script}:16 is now step(10), but the journal recorded step(1)" in proc.stderr
    assert cli.show("e")["status"] != "completed"


def test_replay_without_an_edit_still_completes(tmp_path):
    """An unchanged script replays its journal and completes with the same result."""
    cli = Cli(tmp_path)
    got = _killed_then_resumed(cli, "e", str(QUIET / "edited_agent.py"), after=4,
                               resume_options=("--strategy", "replay"))
    assert got == [0, 1, 2, 3, 4, 5]


def test_the_code_changed_message_says_what_replay_requires(tmp_path):
    """Resuming changed code is refused, and the hint says replay needs the same calls."""
    cli = Cli(tmp_path)
    script = tmp_path / "edited.py"
    shutil.copy(QUIET / "edited_agent.py", script)
    killer = Cli.__new__(Cli)
    killer.store, killer.env = cli.store, dict(cli.env, TCC_TEST_KILL_AFTER="2")
    assert killer.run("run", "--run-id", "c", str(script)).returncode == -9
    script.write_text(script.read_text().replace("out.append(await step(i * FACTOR))",
                                                 "out.append(await step(i * FACTOR + 0))"))
    proc = cli.run("resume", "--code", "current", "c")
    assert proc.returncode == 1 and "CodeChanged" not in proc.stdout
    assert "works only if the code still makes the same calls with the same arguments" in proc.stderr
    assert "tcc resume --strategy replay c" in proc.stderr


# ------------------------------------------------------------ 5: --run-id reuse

def test_run_id_reuse_with_another_script_or_arguments_is_refused(tmp_path):
    """`tcc run --run-id X` of an unfinished run X names both entries instead of resuming X."""
    cli = Cli(tmp_path)
    first = str(QUIET / "edited_agent.py")
    killer = Cli.__new__(Cli)
    killer.store, killer.env = cli.store, dict(cli.env, TCC_TEST_KILL_AFTER="2")
    assert killer.run("run", "--run-id", "x", first).returncode == -9
    other = str(QUIET / "answer_agent.py")
    proc = cli.run("run", "--run-id", "x", other)
    assert proc.returncode == 2
    assert f"{first}:main []" in proc.stderr and f"{other}:main []" in proc.stderr
    proc = cli.run("run", "--run-id", "x", first, "extra")
    assert proc.returncode == 2 and '["extra"]' in proc.stderr
    assert cli.show("x")["status"] == "running"
    assert _result(cli.run("run", "--json", "--run-id", "x", first)) == [0, 1, 2, 3, 4, 5]


# ------------------------------------------------------------ 6: fork --set / --answer

def test_fork_set_of_the_variable_receiving_the_answer_is_refused(tmp_path):
    """--set on `answer = await llm(...)`'s target is refused and points to --answer."""
    cli = Cli(tmp_path)
    cli.run("run", "--run-id", "p", str(QUIET / "answer_agent.py"), check=True)
    first = cli.show("p")["snapshots"][0]["number"]
    proc = cli.run("fork", "--at", str(first), "--set", 'answer="x"', "p")
    assert proc.returncode == 2
    assert "stores the answer it is waiting for into 'answer'" in proc.stderr and "--answer" in proc.stderr


def test_fork_answer_replaces_what_the_frame_receives(tmp_path):
    """--answer JSON makes the resumed frame receive that answer instead of the recorded one."""
    cli = Cli(tmp_path)
    cli.run("run", "--run-id", "p", str(QUIET / "answer_agent.py"), check=True)
    first = cli.show("p")["snapshots"][0]["number"]
    cli.run("fork", "--at", str(first), "--answer", '"forked"', "--run-id", "f", "p", check=True)
    got = _result(cli.run("resume", "--json", "f"))
    assert got == ["forked", "model on follow-up to forked"]
    assert cli.show("p")["result"] == ["model on first", "model on follow-up to model on first"]


# ------------------------------------------------------------ 8: retry and retention

def test_retry_issues_the_failed_call_again_after_an_outage(tmp_path):
    """A run failed by an outage is retried from its snapshot with the same idempotency key."""
    outage = tmp_path / "outage"
    outage.touch()
    cli = Cli(tmp_path, OUTAGE=str(outage))
    proc = cli.run("run", "--json", "--run-id", "r", f"{QUIET / 'answer_agent.py'}:calls_api")
    assert proc.returncode == 1 and "service down for call 1" in proc.stdout
    assert cli.run("resume", "r").returncode == 1  # the snapshot holds the failure
    outage.unlink()
    assert _result(cli.run("retry", "--json", "r")) == ["api 1", "api 2"]
    keys = [(c["key"], c["attempt"]) for c in _intents(cli, "r") if c["name"].endswith(":api")]
    assert keys[:3] == [("r:1", 1), ("r:1", 2), ("r:1", 3)]
    proc = cli.run("retry", "r")
    assert proc.returncode == 2 and "not failed" in proc.stderr


def test_a_retry_killed_while_its_attempt_ran_is_resumed_in_doubt(tmp_path):
    """`tcc retry` killed while its new attempt ran: `tcc resume` issues that attempt again
    in doubt (its verify probe finds it) instead of throwing the old failure from the
    snapshot, which reported the run failed although the effect had succeeded."""
    ledger, fail = tmp_path / "ledger", tmp_path / "fail"
    fail.touch()
    agent = f"{AGENTS / 'doubt_agent.py'}:flaky_once"
    cli = Cli(tmp_path, LEDGER=str(ledger), FAIL=str(fail))
    assert cli.run("run", "--run-id", "fr", agent).returncode == 1
    fail.unlink()
    dying = Cli(tmp_path, LEDGER=str(ledger), FAIL=str(fail), DIE_ON="h")
    assert dying.run("retry", "fr").returncode == -9
    assert _result(cli.run("resume", "--json", "fr")) == "h (found)"
    assert ledger.read_text().splitlines() == ["fr:1 h", "fr:1 h"]  # not run a third time


def test_retry_refuses_a_run_that_failed_in_its_own_code(tmp_path):
    """A KeyError of the agent itself is not an effect call to retry."""
    cli = Cli(tmp_path)
    assert cli.run("run", "--run-id", "b", f"{QUIET / 'answer_agent.py'}:buggy").returncode == 1
    epoch = cli.show("b")["epoch"]
    proc = cli.run("retry", "b")
    assert proc.returncode == 2 and "did not fail in an effect call" in proc.stderr
    # refused before anything was taken over: no "resuming", no claim, no events
    assert "resuming" not in proc.stdout and cli.show("b")["epoch"] == epoch


def test_keep_retains_more_snapshots_for_fork_at(tmp_path):
    """`tcc run --keep 10` keeps every snapshot of a 6-step run, even through `tcc gc`."""
    cli = Cli(tmp_path)
    cli.run("run", "--run-id", "k", "--keep", "10", str(QUIET / "edited_agent.py"), check=True)
    cli.run("run", "--run-id", "d", str(QUIET / "edited_agent.py"), check=True)
    cli.run("gc", check=True)
    assert [s["number"] for s in cli.show("k")["snapshots"]] == [1, 2, 3, 4, 5, 6]
    assert len(cli.show("d")["snapshots"]) == 3
    cli.run("fork", "--at", "2", "--run-id", "f", "k", check=True)
    assert _result(cli.run("resume", "--json", "f")) == [0, 1, 2, 3, 4, 5]


def _intents(cli, run_id):
    """The run's intent records, read through the store API in a child process."""
    code = ("import json,sys; from tcc.store import open_store\n"
            "with open_store(sys.argv[1]) as s:\n"
            "    print(json.dumps([{'name': r.name, 'key': r.idempotency_key, 'attempt': r.attempt}"
            " for r in s.journal(sys.argv[2]) if r.kind == 'intent']))")
    out = subprocess.run([sys.executable, "-c", code, str(cli.store), run_id], env=cli.env,
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def test_a_resource_passed_to_effects_is_built_once_per_process(tmp_path):
    """Effects get copies of their arguments, but a tcc.resource in them stays the live one."""
    script = tmp_path / "res.py"
    script.write_text(
        "import tcc\n"
        "BUILT = []\n"
        "def make():\n"
        "    BUILT.append(1)\n"
        "    return object()\n"
        "@tcc.effect\n"
        "def use(client, i):\n"
        "    return id(client._get())\n"
        "async def main():\n"
        "    client = tcc.resource(make)\n"
        "    ids = [await use(client, i) for i in range(3)]\n"
        "    return [len(set(ids)), len(BUILT)]\n")
    assert _result(Cli(tmp_path).run("run", "--json", str(script))) == [1, 1]


@pytest.mark.parametrize("strategy", ["replay", "hybrid"])
def test_replay_of_calls_that_pass_a_resource_is_not_a_divergence(tmp_path, strategy):
    """A resource re-created by replay is the same argument as the recorded one (its factory call)."""
    script = tmp_path / "res_replay.py"
    script.write_text(
        "import collections\n"
        "import tcc\n"
        "class Holder:\n"
        "    def __init__(self, client):\n"
        "        self.client = client\n"
        "@tcc.effect\n"
        "def use(holder, x):\n"
        "    return x\n"
        "async def main():\n"
        "    holder = Holder(tcc.resource(collections.OrderedDict))\n"
        "    return [await use(holder, i) for i in range(3)]\n")
    cli = Cli(tmp_path)
    got = _killed_then_resumed(cli, "r", str(script), after=2,
                               options=("--strategy", strategy, "--checkpoint-every", "5"))
    assert got == [0, 1, 2]


# Fingerprints of the requests' ``__await__`` code as tcc 958c800 wrote them: the innermost
# frame of nearly every snapshot is one of these, so a change strands every suspended run.
AWAIT_FINGERPRINTS = {(3, 11): "7555976633f5bfef", (3, 12): "4879fa88e9acbd35",
                      (3, 13): "ed7a40e914873d7a"}


def test_the_requests_await_code_is_unchanged_so_older_snapshots_resume():
    """EffectRequest.__await__ and its siblings keep the code that older snapshots reference."""
    from tcc.capture._fingerprint import fingerprint
    from tcc.effects import _effect

    expected = AWAIT_FINGERPRINTS.get(sys.version_info[:2])
    if expected is None:
        pytest.skip(f"no recorded fingerprint for Python {sys.version_info[:2]}")
    for name in ("EffectRequest", "GatherRequest", "CheckpointRequest", "WaitRequest",
                 "SleepRequest", "SpawnRequest"):
        code = getattr(_effect, name).__await__.__code__
        assert fingerprint(code).hex()[:16] == expected, name


# ------------------------------------------------------------ edge cases of the patterns above

@pytest.mark.parametrize("strategy", ["replay", "hybrid"])
def test_a_dataclass_holding_a_resource_is_the_same_argument_under_replay(tmp_path, strategy):
    """A dataclass's own __eq__ says a replayed resource differs; its fields are equivalent."""
    cli = Cli(tmp_path)
    got = _killed_then_resumed(cli, "d", str(QUIET / "resource_dataclass_agent.py"), after=2,
                               options=("--strategy", strategy, "--checkpoint-every", "5"))
    assert got == ["A", "B", "C"]


def test_a_module_level_cache_of_clients_is_left_to_the_import(tmp_path):
    """A global dict filled with uncapturable clients is released (an event), not a failure."""
    cli = Cli(tmp_path)
    doc = json.loads(cli.run("run", "--json", "--run-id", "c", str(QUIET / "client_cache_agent.py")).stdout)
    assert doc["status"] == "completed" and doc["result"] == ["A", "B"]
    released = [e for e in cli.show("c")["events"] if e["kind"] == "module_state_released"]
    assert released and "_clients (builtins.dict) of client_cache_agent.py" in released[0]["data"]["globals"]


def test_os_environ_imported_by_name_is_never_captured(tmp_path):
    """`from os import environ` stays the live environment: no secret in snapshots, the new value after resume."""
    cli = Cli(tmp_path, MY_KEY="sk-OLD-SECRET-XYZ")
    killer = Cli.__new__(Cli)
    killer.store, killer.env = cli.store, dict(cli.env, TCC_TEST_KILL_AFTER="2")
    assert killer.run("run", "--run-id", "e", str(QUIET / "environ_agent.py")).returncode == -9
    resumer = Cli.__new__(Cli)
    resumer.store, resumer.env = cli.store, dict(cli.env, MY_KEY="sk-NEW-LONGER-KEY-12345")
    assert _result(resumer.run("resume", "--json", "e")) == ["0:17", "1:17", "2:23"]
    store_bytes = b"".join(p.read_bytes() for p in cli.store.iterdir() if p.is_file())
    assert b"sk-OLD-SECRET-XYZ" not in store_bytes


def test_lazily_imported_siblings_are_captured_whatever_their_name(tmp_path):
    """Modules next to the script imported mid-run, `tccstate` included, resume with their data."""
    cli = Cli(tmp_path)
    got = _killed_then_resumed(cli, "s", str(QUIET / "lazy_siblings" / "agent.py"), after=2)
    assert got == [[0, 1, 2], [0, 1, 2]]


def test_a_second_retry_under_hybrid_issues_the_call_again(tmp_path):
    """`tcc retry` twice (the outage outlasts the first) still re-issues the failed call."""
    ok = tmp_path / "ok"
    cli = Cli(tmp_path, OK_FILE=str(ok))
    script = str(QUIET / "retry_hybrid_agent.py")
    assert cli.run("run", "--run-id", "x", "--strategy", "hybrid", "--snapshot-every", "2",
                   script).returncode == 1
    assert cli.run("retry", "x").returncode == 1  # still down
    ok.touch()
    assert _result(cli.run("retry", "--json", "x")) == [[0, 1, 2, "flaky(3)", 99], [0, 1, 2]]


def test_fork_of_a_gather_checks_the_answer_and_sees_unpacked_targets(tmp_path):
    """`a, b = await tcc.gather(...)`: --set a is refused, --answer needs one answer per call."""
    cli = Cli(tmp_path)
    cli.run("run", "--run-id", "g", f"{QUIET / 'answer_agent.py'}:gathered", check=True)
    first = str(cli.show("g")["snapshots"][0]["number"])
    proc = cli.run("fork", "--at", first, "--set", 'first="x"', "g")
    assert proc.returncode == 2 and "stores the answer it is waiting for into 'first'" in proc.stderr
    proc = cli.run("fork", "--at", first, "--answer", '["only one"]', "g")
    assert proc.returncode == 2 and "tcc.gather() of 2 calls" in proc.stderr
    cli.run("fork", "--at", first, "--answer", '["A", "B"]', "--run-id", "h", "g", check=True)
    assert _result(cli.run("resume", "--json", "h")) == ["A", "B"]


def test_a_module_level_none_is_data_not_another_modules_object(tmp_path):
    """`MARK = os.environ.get("MARK")` (None) is captured and named in no note."""
    cli = Cli(tmp_path)
    proc = cli.run("run", "--run-id", "m", f"{AGENTS / 'misc_agent.py'}:ok", check=True)
    assert "tcc: note" not in proc.stderr


def test_names_imported_from_other_modules_are_not_named_as_uncapturable(tmp_path):
    """`from __future__ import annotations` (a _Feature object) gives no note: it is another module's."""
    cli = Cli(tmp_path)
    proc = cli.run("run", str(EXAMPLES / "research_agent.py"), "topic", check=True)
    assert "tcc: note" not in proc.stderr


def test_the_agents_modules_are_found_through_links_and_others_are_not(tmp_path: pathlib.Path) -> None:
    """Which modules hold the agent's module-level data: those whose file is in the script's
    folder, however the path reaches it (a linked folder, a linked file), and no other."""
    import types

    from tcc.runtime._globals import ModuleState

    agent_dir, other = tmp_path / "agent", tmp_path / "other"
    agent_dir.mkdir()
    other.mkdir()
    for name in ("main.py", "helper.py", "linked_target.py"):
        (agent_dir / name).write_text("X = 1\n")
    (other / "lib.py").write_text("X = 1\n")
    (tmp_path / "alias").symlink_to(agent_dir, target_is_directory=True)
    (other / "linked.py").symlink_to(agent_dir / "linked_target.py")

    def module(name: str, file: pathlib.Path) -> types.ModuleType:
        m = types.ModuleType(name)
        m.__file__ = str(file)
        return m

    script = module("__tcc_script_main", agent_dir / "main.py")
    state = ModuleState(script)
    assert state._judge(script)
    assert state._judge(module("helper", agent_dir / "helper.py"))
    assert state._judge(module("helper_via_alias", tmp_path / "alias" / "helper.py"))
    assert state._judge(module("linked", other / "linked.py"))
    assert not state._judge(module("lib", other / "lib.py"))
    assert not state._judge(module("tcc.fake", agent_dir / "helper.py"))  # tcc's own
    assert not state._judge(module("missing", tmp_path / "gone" / "x.py"))


def _record_module_calls(monkeypatch: pytest.MonkeyPatch, method: str) -> list[str]:
    """Wrap ``ModuleState.<method>(self, module)`` so that each call appends the module's
    name to the returned list (the call itself still runs)."""
    from tcc.runtime import _globals

    calls: list[str] = []
    real = getattr(_globals.ModuleState, method)

    def recording(self: Any, module: Any) -> Any:
        calls.append(module.__name__)
        return real(self, module)

    monkeypatch.setattr(_globals.ModuleState, method, recording)
    return calls


def test_module_verdicts_are_kept_for_the_process_and_redone_for_a_new_module(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each recovery builds a ModuleState; in a long-lived process (a worker) it judges only
    the modules it has not seen, and a module imported again (a new object under the same
    name) is judged again, so a verdict never outlives the module it was made for."""
    import sys
    import types

    from tcc.runtime import _globals

    agent_dir = tmp_path / "agent"
    agent_dir.mkdir()
    (agent_dir / "main.py").write_text("X = 1\n")
    (agent_dir / "helper_mod_v.py").write_text("X = 1\n")
    script = types.ModuleType("__tcc_script_main_v")
    script.__file__ = str(agent_dir / "main.py")
    judged = _record_module_calls(monkeypatch, "_judge")
    helper = types.ModuleType("helper_mod_v")
    helper.__file__ = str(agent_dir / "helper_mod_v.py")
    monkeypatch.setitem(sys.modules, "helper_mod_v", helper)
    first = _globals.ModuleState(script)
    assert helper in first._modules
    assert "helper_mod_v" in judged and len(judged) > 10  # every loaded module, once
    judged.clear()
    second = _globals.ModuleState(script)
    assert judged == [] and helper in second._modules
    again = types.ModuleType("helper_mod_v")  # re-imported: another object
    again.__file__ = str(tmp_path / "elsewhere.py")
    monkeypatch.setitem(sys.modules, "helper_mod_v", again)
    third = _globals.ModuleState(script)
    assert judged == ["helper_mod_v"]
    assert again not in third._modules and helper not in third._modules
    # the same object pointed at another file (a loader that sets __file__ late) is judged
    # again, not given the verdict made for its old file
    judged.clear()
    again.__file__ = str(agent_dir / "helper_mod_v.py")
    fourth = _globals.ModuleState(script)
    assert judged == ["helper_mod_v"] and again in fourth._modules
    # one module judged for many agent folders keeps a bounded number of verdicts
    for k in range(3 * _globals._FOLDERS_LIMIT):
        other = tmp_path / f"agent{k}"
        other.mkdir()
        (other / "main.py").write_text("X = 1\n")
        elsewhere = types.ModuleType(f"__tcc_script_main_v{k}")
        elsewhere.__file__ = str(other / "main.py")
        _globals.ModuleState(elsewhere)
    assert len(_globals._VERDICTS[id(again)][1]) <= _globals._FOLDERS_LIMIT


def test_restoring_module_data_looks_again_only_at_what_can_have_changed(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A restore writes a snapshot's module-level data back; it does not walk every loaded
    module again (a second walk of ~220 modules on every recovery) unless something that
    decides which modules are the agent's can have changed: a module imported since the
    first look (found by the count), or data naming a dunder (``__file__``)."""
    import sys
    import types

    from tcc.runtime import _globals

    agent_dir = tmp_path / "agent"
    agent_dir.mkdir()
    (agent_dir / "main.py").write_text("X = 1\n")
    (agent_dir / "late_mod_r.py").write_text("X = 1\n")
    script = types.ModuleType("__tcc_script_main_r")
    script.__file__ = str(agent_dir / "main.py")
    monkeypatch.setitem(sys.modules, "__tcc_script_main_r", script)
    looked = _record_module_calls(monkeypatch, "_belongs")
    state = _globals.ModuleState(script)
    assert len(looked) > 10
    looked.clear()
    state.restore({"__tcc_script_main_r": {"X": 2}})
    assert script.X == 2 and looked == []  # nothing new: no second walk
    state.restore({"__tcc_script_main_r": {"__cache": {"k": 1}}})  # private, not a dunder
    assert vars(script)["__cache"] == {"k": 1} and looked == []
    # a module imported while the snapshot loaded is found
    late = types.ModuleType("late_mod_r")
    late.__file__ = str(agent_dir / "late_mod_r.py")
    monkeypatch.setitem(sys.modules, "late_mod_r", late)
    state.restore({"__tcc_script_main_r": {"X": 3}})
    assert late in state._modules and "late_mod_r" in looked
    # data that rewrites a module's __file__ makes every module be looked at again
    elsewhere = types.ModuleType("elsewhere_mod_r")
    elsewhere.__file__ = str(tmp_path / "elsewhere_mod_r.py")
    monkeypatch.setitem(sys.modules, "elsewhere_mod_r", elsewhere)
    state.restore({"__tcc_script_main_r": {"X": 4}})
    assert elsewhere not in state._modules
    looked.clear()
    state.restore({"elsewhere_mod_r": {"__file__": str(agent_dir / "elsewhere_mod_r.py")}})
    assert len(looked) > 10 and elsewhere in state._modules


# ----------------------------------------------- dict views and iterators held across effects

@pytest.mark.parametrize("entry, expected, kills", [
    ("main", {"budget": {"k1": 1, "k2": 3, "k3": 5}, "seen": [3, 2, 100]}, (1, 2, 4, 5)),
    ("pending", {"done": [1, 2, 3], "left": []}, (1, 2)),
])
def test_dict_views_and_iterators_follow_their_dict_after_a_crash(tmp_path, entry, expected, kills):
    """A `for` over `d.items()` / `reversed(d.values())` and a `d.keys()` view kept in a local
    read the dict as it is after the resume (they used to be restored over a frozen copy:
    later effects got the old values, and a view of popped tasks re-ran the first task for ever)."""
    cli = Cli(tmp_path)
    script = f"{QUIET / 'dict_views_agent.py'}:{entry}"
    assert _result(cli.run("run", "--json", script)) == expected
    for after in kills:
        assert _killed_then_resumed(cli, f"{entry}-{after}", script, after=after) == expected
        events = [e["kind"] for e in cli.show(f"{entry}-{after}")["events"]]
        assert "module_state_released" not in events


# ------------------------------------- results are copies, on the live path as from the journal

ALIASED = {"CONFIG": {"retries": 1}, "cfg_is_CONFIG": False, "first": ["a", "seen"], "again": ["a"],
           "same": False}


@pytest.mark.parametrize("options", [(), ("--strategy", "hybrid", "--checkpoint-every", "2"),
                                     ("--strategy", "replay")], ids=["continuation", "hybrid", "replay"])
def test_an_effect_result_is_a_copy_whether_it_ran_or_was_served(tmp_path, options):
    """An effect returning a module-level dict, or the same cached list twice: the agent gets
    copies in an uninterrupted run too, as it does when a resumed run is served the journal
    (it used to get the shared objects live and copies after a crash)."""
    cli = Cli(tmp_path)
    script = str(QUIET / "aliased_result_agent.py")
    assert _result(cli.run("run", "--json", *options, script)) == ALIASED
    for after in (1, 2, 3):
        assert _killed_then_resumed(cli, f"a{after}", script, after=after, options=options) == ALIASED


# ------------------------------------------- process state outside the frames is named

def test_tcc_run_names_the_lines_that_set_process_state_a_snapshot_does_not_hold(tmp_path):
    """Seeding the global generator, the decimal context, class and function attributes and
    a filled mutable default are named with their lines when the run starts (a resumed run
    gets them as the import makes them); a random.Random held in a variable is not."""
    cli = Cli(tmp_path)
    script = QUIET / "process_state_agent.py"
    proc = cli.run("run", "--json", "--run-id", "p", str(script))
    assert _result(proc) is True
    notes = [line for line in proc.stderr.splitlines() if line.startswith("tcc: note: process_state_agent.py:")]
    said = [line[len("tcc: note: "):].split(": ", 1)[0] for line in notes]
    assert said == [
        "process_state_agent.py:20 sets a class attribute (cls.count)",
        "process_state_agent.py:24 changes the default value of parameter 'memo' of seen()",
        "process_state_agent.py:33 calls random.seed()",
        "process_state_agent.py:34 calls reseed()",
        "process_state_agent.py:35 sets decimal.getcontext().prec",
        "process_state_agent.py:36 sets Registry.count",
        "process_state_agent.py:38 sets tag.calls",
    ], notes
    assert all(line.endswith('(README, "Process state")') for line in notes)
    started = next(e for e in cli.show("p")["events"] if e["kind"] == "started")
    assert len(started["data"]["process_state"]) == 7


def test_an_agent_that_keeps_its_state_where_snapshots_hold_it_gets_no_such_note(tmp_path):
    cli = Cli(tmp_path)
    proc = cli.run("run", "--json", str(QUIET / "mutating_agent.py"))
    assert _result(proc) == EXPECTED_CHAT
    assert "tcc: note" not in proc.stderr


def test_a_resource_in_an_effect_result_stays_the_live_one(tmp_path):
    """The copy of a result keeps a tcc.resource it holds as the live object, as arguments do
    (a new, unbuilt copy would build its client again)."""
    cli = Cli(tmp_path)
    assert _result(cli.run("run", "--json", f"{QUIET / 'aliased_result_agent.py'}:resource")) == {"same": True}


# ------------------------------ views of and attributes on objects the agent keeps using

@pytest.mark.parametrize("entry, expected, kills", [
    ("window", {"buf": "..AABB..", "view": "AABB", "kind": "memoryview"}, (1,)),
    ("registry", {"known": ["alpha", "beta", "delta", "gamma"], "kind": "mappingproxy"}, (1, 2)),
    ("budget", {"steps": 5, "tokens": 200, "limit": 200, "tag": "run"}, (1, 3)),
])
def test_views_and_container_attributes_survive_a_crash(tmp_path, entry, expected, kills):
    """A memoryview window into a bytearray, a MappingProxyType of a dict, and a Counter or
    defaultdict subclass with its own attributes come back as they were: a memoryview used to
    come back as bytes, a proxy as a proxy of a copy, and a Counter subclass with its class's
    limit (the agent then ran 25 steps instead of 5)."""
    cli = Cli(tmp_path)
    script = f"{QUIET / 'shared_views_agent.py'}:{entry}"
    assert _result(cli.run("run", "--json", script)) == expected
    for after in kills:
        assert _killed_then_resumed(cli, f"{entry}-{after}", script, after=after) == expected


# ------------------------------------------------ sentinels keep their identity after a crash

SENTINELS = [["miss", "a"], True, ["miss", "b"], True, ["hit", "a"], True, ["miss", "c"], True,
             ["hit", "b"], True]


def test_sentinels_held_across_effects_are_still_the_sentinels_after_a_crash(tmp_path):
    """``hit is MISSING`` for a library's ``MISSING = object()``, and ``dataclasses.MISSING``,
    answer after a resume as before (a copy made a miss look like a hit: a fetch skipped)."""
    cli = Cli(tmp_path)
    script = str(QUIET / "sentinel_agent.py")
    assert _result(cli.run("run", "--json", script)) == SENTINELS
    for after in (1, 3, 6):
        assert _killed_then_resumed(cli, f"s{after}", script, after=after) == SENTINELS


# ------------------------------------------------ a crash inside an attempt uses no retry

@pytest.mark.parametrize("entry, expected", [("main", "ok charge-42"), ("gathered", ["ok a", "ok b"])])
def test_a_crash_inside_an_attempt_does_not_use_up_a_retry(tmp_path, entry, expected):
    """retries=2 and an upstream that fails twice: three attempts succeed.  With the process
    killed inside the first attempt, the re-issued call (in doubt) used to count as the
    second attempt, and the call gave up after two failures."""
    script = f"{QUIET / 'retry_budget_agent.py'}:{entry}"
    (tmp_path / "plain.d").mkdir()
    (tmp_path / "killed.d").mkdir()
    plain = Cli(tmp_path / "plain", UPSTREAM_STATE=str(tmp_path / "plain.d"))
    assert _result(plain.run("run", "--json", script)) == expected
    cli = Cli(tmp_path / "killed", UPSTREAM_STATE=str(tmp_path / "killed.d"),
              CRASH_ONCE=str(tmp_path / "crashed"))
    proc = cli.run("run", "--json", "--run-id", "r", script)
    assert proc.returncode == -9, proc.stderr  # killed inside its first attempt
    assert _result(cli.run("resume", "--json", "r")) == expected
    kinds = [e["kind"] for e in cli.show("r")["events"]]
    assert "in_doubt_reissued" in kinds


def test_tcc_run_names_working_directory_stream_and_environment_changes(tmp_path):
    """A `with chdir(...)` or `with redirect_stdout(...)` block suspended at an effect, and
    environment variables set by the run, are not in a snapshot: a resumed run works in the
    resuming process's directory and prints to the real stream.  Each such line is named."""
    cli = Cli(tmp_path)
    proc = cli.run("run", "--json", str(QUIET / "process_state_more_agent.py"))
    assert _result(proc) == 3
    said = [line[len("tcc: note: "):].split(": ", 1)[0] for line in proc.stderr.splitlines()
            if line.startswith("tcc: note: process_state_more_agent.py:")]
    assert said == [
        "process_state_more_agent.py:19 calls contextlib.chdir()",
        "process_state_more_agent.py:22 calls contextlib.redirect_stdout()",
        "process_state_more_agent.py:24 sets os.environ[...]",
        "process_state_more_agent.py:25 calls os.environ.update()",
        "process_state_more_agent.py:26 sets sys.stdout",
        "process_state_more_agent.py:27 sets sys.stdout",
        "process_state_more_agent.py:28 calls os.chdir()",
        "process_state_more_agent.py:36 changes Agent.history (a class attribute) through an instance",
    ], proc.stderr


def test_an_effect_knows_its_tenant_to_scope_its_idempotency_key(tmp_path):
    """Keys are RUN_ID:N, unique within a store and tenant: two tenants' runs of one id send
    the same key.  An effect that shares an idempotent API across tenants reads its tenant
    from tcc.current() and puts it in the key (README, "Effect semantics")."""
    script = tmp_path / "pay.py"
    script.write_text("import tcc\n\n@tcc.effect\ndef charge():\n    c = tcc.current()\n"
                      "    return [c.tenant, c.idempotency_key]\n\n"
                      "async def main():\n    return [tcc.current().tenant, *await charge()]\n\n"
                      "def sync_main():\n    return [tcc.current().tenant, *charge()]\n")
    cli = Cli(tmp_path)
    acme = _result(cli.run("run", "--json", "--tenant", "acme", "--run-id", "nightly-7", str(script)))
    globex = _result(cli.run("run", "--json", "--tenant", "globex", "--run-id", "nightly-7", str(script)))
    assert acme == ["acme", "acme", "nightly-7:1"] and globex == ["globex", "globex", "nightly-7:1"]
    plain = _result(cli.run("run", "--json", "--tenant", "acme", "--run-id", "s", f"{script}:sync_main"))
    assert plain == ["acme", "acme", "s:1"]


def test_a_crash_inside_the_attempt_tcc_retry_issued_does_not_use_up_its_retries(tmp_path):
    """retries=2, an upstream down for 4 answers: the run fails after 3 attempts; `tcc retry`
    gives the call its retries again (attempts 4 to 6), and its attempt 4 is killed.  The
    resumed call must still have attempts 5 and 6 (it counted every failure since the call
    began, and gave up after one)."""
    (tmp_path / "up").mkdir()
    script = f"{QUIET / 'retry_budget_agent.py'}:uncaught"
    cli = Cli(tmp_path, UPSTREAM_STATE=str(tmp_path / "up"), FAILS="4")
    failed = cli.run("run", "--json", "--run-id", "t", script)
    assert failed.returncode == 1 and json.loads(failed.stdout)["status"] == "failed"
    killer = Cli.__new__(Cli)
    killer.store, killer.env = cli.store, dict(cli.env, CRASH_ONCE=str(tmp_path / "crashed"))
    assert killer.run("retry", "t").returncode == -9  # killed inside attempt 4
    assert _result(cli.run("resume", "--json", "t")) == "ok charge-43"


def test_an_effects_exception_holding_a_live_object_is_caught_by_its_class_on_every_path(tmp_path):
    """An HTTP error carrying its live response (a lock inside): journaled as the same class
    without that attribute (a note says so), and the agent gets that form whether the call
    ran or was served from the journal after a crash."""
    expected = ["body of a", "error 503 for bad1 response=None noted=True", "body of b", "body of c"]
    cli = Cli(tmp_path)
    script = str(QUIET / "live_exception_agent.py")
    assert _result(cli.run("run", "--json", script)) == expected
    for after in (1, 2, 3):
        assert _killed_then_resumed(cli, f"e{after}", script, after=after) == expected
    replayed = _result(cli.run("run", "--json", "--strategy", "replay", script))
    assert replayed == expected


def test_an_exception_with_notes_and_a_live_attribute_is_journaled_once_with_its_notes():
    """Its notes are copied once (the copy's note list was the original's, and appending
    to it while reading it never ended), and the live exception keeps its own."""
    import threading

    from tcc.errors import CaptureError
    from tcc.runtime._journal import journalable_exception

    class Failed(Exception):
        pass

    exc = Failed("503")
    exc.add_note("while calling the API")
    exc.pool = threading.Lock()
    copy = journalable_exception(exc, CaptureError("cannot pickle '_thread.lock' object"))
    assert type(copy) is Failed and copy.args == ("503",) and not hasattr(copy, "pool")
    assert copy.__notes__[0] == "while calling the API" and "dropped: pool" in copy.__notes__[1]
    assert exc.__notes__ == ["while calling the API"] and len(copy.__notes__) == 2


# ------------------------------------ a comprehension's loop variable shadowing a closure's cell

def test_an_await_in_a_comprehension_shadowing_a_cell_resumes_after_a_crash(tmp_path):
    """`{name: await f(name) for name in ...}` in a function where a lambda closes over
    `name`: on 3.12+ the frame suspended inside holds a plain value in the cell's slot (the
    cell waits on the value stack), which the restore refused ("must hold a cell"), so every
    resume of such a run failed for good.  Also nested, where the inner comprehension saves a
    NULL above the cell."""
    cli = Cli(tmp_path)
    script = str(QUIET / "comprehension_cell_agent.py")
    expected = [{"a": "A", "b": "B", "c": "C"},
                [["('X', 0)", "('Y', 0)"], ["('X', 1)", "('Y', 1)"]], "[default]", "k"]
    assert _result(cli.run("run", "--json", script)) == expected
    for after in (2, 5):  # inside the dict comprehension; inside the nested one
        assert _killed_then_resumed(cli, f"c{after}", script, after=after) == expected


# ------------------------------------- a module's globals() and os.environ held in a local

@pytest.mark.parametrize("entry, expected", [("through_globals", [1, 2, 3, 4]),
                                             ("through_environ", ["0", "1", "2", "3"])])
def test_globals_and_environ_held_in_a_local_stay_live_after_a_crash(tmp_path, entry, expected):
    """`g = globals()` and `env = os.environ` held across effects came back as copies: writes
    after a restore went nowhere (`[1, 2, 2, 2]`), and the copy of the environment put every
    variable, secrets included, into the snapshot.  Both are stored by name."""
    cli = Cli(tmp_path)
    script = f"{QUIET / 'namespace_agent.py'}:{entry}"
    secret = "tcc-test-secret-value-7f3a"
    cli.env["TCC_TEST_SECRET"] = secret
    assert _result(cli.run("run", "--json", script)) == expected
    for after in (1, 2):
        assert _killed_then_resumed(cli, f"{entry}-{after}", script, after=after) == expected
    killer = Cli.__new__(Cli)
    killer.store, killer.env = cli.store, dict(cli.env, TCC_TEST_KILL_AFTER="2")
    assert killer.run("run", "--run-id", "held", script).returncode == -9
    shown = cli.run("inspect", "held", check=True).stdout
    assert secret not in shown  # the snapshot names the environment or module; it holds neither
    assert ("process_environ" if entry == "through_environ" else "globals()") in shown, shown


def test_a_weak_proxy_held_across_effects_is_refused_at_once(tmp_path):
    """A weakref.proxy came back as a detached copy of its object (a counter kept through it
    read 0 after a crash); like weakref.ref, it is refused, while the run is live."""
    cli = Cli(tmp_path)
    proc = cli.run("run", f"{QUIET / 'namespace_agent.py'}:through_proxy")
    assert proc.returncode == 1
    assert "local 'w'" in proc.stdout + proc.stderr and "weak proxies (weakref.proxy) cannot be captured" \
        in proc.stdout + proc.stderr


# -------------------------------------- the program's subclasses of built-in value types

def test_subclasses_of_builtin_types_come_back_whole_after_a_crash(tmp_path):
    """An `LRU(OrderedDict)` with a capacity, a `TagSet(set)` whose __init__ takes an owner, a
    `deque` subclass with its own __init__, a `Random` subclass with (seed, tag), a `Decimal`
    subclass with an attribute, and a class whose __new__ takes a name: the snapshots were
    written, but a restore failed for good (the LRU, the Random, the Symbol), lost items (the
    TagSet) or attributes (the Money's currency), quietly."""
    cli = Cli(tmp_path)
    script = str(QUIET / "subclass_agent.py")
    expected = _result(cli.run("run", "--json", script))
    assert expected["cache"] == [[4, 40], [5, 50], [1, 10]] and expected["owner"] == "alice"
    assert expected["price"] == ["12.50", "EUR"] and expected["maxlen"] == 3
    for after in (1, 3, 4):
        assert _killed_then_resumed(cli, f"s{after}", script, after=after) == expected
    # a class whose __new__ wants an argument pickle never gives: refused while the run is
    # live (every restore of it failed, for good), saying what to add
    proc = cli.run("run", f"{script}:unpicklable_new")
    assert proc.returncode == 1, proc.stderr
    assert "Interned.__new__ requires arguments that pickling does not pass" in proc.stdout + proc.stderr
    assert "define __getnewargs__" in proc.stdout + proc.stderr
