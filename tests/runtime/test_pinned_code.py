"""Pinned code (issue 22, part 1): a run records the source of its own modules, and
`tcc resume --code pinned` continues it on that source after the files changed or were
deleted.  Every test kills a real run with SIGKILL, edits its files, and resumes it in a
new process; the expected result is the one an uninterrupted run of the *original* code
gives, computed by running that code to the end in a store of its own.
"""

from __future__ import annotations

import hashlib
import json
import pathlib

import pytest

from tcc.store import open_store
from tcc.store._pgschema import SCHEMA_VERSION
from tests._support.pgstores import make_pg_store
from tests._support.runs import Cli

AGENT = '''\
import tcc
import helpers

COUNT = 0


@tcc.effect
def step(i):
    return i


async def main(n):
    global COUNT
    out = []
    for i in range(int(n)):
        v = await step(i)
        COUNT += 1
        out.append(helpers.shape(v) + COUNT)
    return out
'''

HELPERS = '''\
def shape(v):
    return v * 10
'''


def _project(tmp: pathlib.Path) -> pathlib.Path:
    folder = tmp / "project"
    folder.mkdir(parents=True)
    (folder / "agent.py").write_text(AGENT)
    (folder / "helpers.py").write_text(HELPERS)
    return folder / "agent.py"


def _result(proc) -> object:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["result"]


def _uninterrupted(tmp: pathlib.Path, *args: str) -> object:
    """What the original code gives when nothing interrupts it (a store of its own)."""
    script = _project(tmp / "reference")
    return _result(Cli(tmp / "reference").run("run", "--json", str(script), *args))


def _killed(cli: Cli, run_id: str, *args: str, after: int, command: str = "run") -> None:
    """``tcc run`` (or ``resume``) SIGKILLed right after its ``after``-th step."""
    killer = Cli.__new__(Cli)
    killer.store, killer.env = cli.store, dict(cli.env, TCC_TEST_KILL_AFTER=str(after))
    if command == "run" and "--on-code-change" in args:  # tcc options go before the script
        at = args.index("--on-code-change")
        args = (*args[at:at + 2], *args[:at], *args[at + 2:])
    proc = killer.run(command, *(("--run-id", run_id) if command == "run" else ()), *args)
    assert proc.returncode == -9, (proc.returncode, proc.stderr)
    assert cli.show(run_id)["status"] == "running"


def _edit(script: pathlib.Path) -> None:
    """A bug fix after the await in the script, and a changed helper next to it."""
    script.write_text(script.read_text().replace("COUNT += 1", "COUNT += 2"))
    helpers = script.with_name("helpers.py")
    helpers.write_text(helpers.read_text().replace("v * 10", "v * 100"))


def _code_events(cli: Cli, run_id: str) -> list[dict]:
    return [e["data"] for e in cli.show(run_id)["events"] if e["kind"] == "code"]


def test_a_run_records_its_modules_and_resumes_on_them_after_an_edit(tmp_path):
    expected = _uninterrupted(tmp_path, "5")
    cli = Cli(tmp_path)
    script = _project(tmp_path)
    _killed(cli, "r", str(script), "5", after=2)
    recorded = _code_events(cli, "r")[0]["modules"]
    assert set(recorded) == {"__tcc_script_agent", "helpers"}, recorded
    assert recorded["helpers"]["sha256"] == hashlib.sha256(HELPERS.encode()).hexdigest()

    _edit(script)
    refused = cli.run("resume", "--code", "current", "r")
    assert refused.returncode == 1
    assert "main() (" in refused.stderr and "has changed since the snapshot was taken" in refused.stderr
    assert "`tcc resume --code pinned r` continues the run on the code it recorded" in refused.stderr
    assert cli.show("r")["status"] == "running"  # the refusal changed nothing

    assert _result(cli.run("resume", "--json", "--code", "pinned", "r")) == expected
    # the edited files were left alone, and a new run uses them
    assert "COUNT += 2" in script.read_text()
    fresh = _result(cli.run("run", "--json", str(script), "2"))
    assert fresh == [0 + 2, 100 + 4]


def test_pinned_resume_after_the_script_and_its_helper_were_deleted(tmp_path):
    expected = _uninterrupted(tmp_path, "4")
    cli = Cli(tmp_path)
    script = _project(tmp_path)
    _killed(cli, "gone", str(script), "4", after=1)
    script.unlink()
    script.with_name("helpers.py").unlink()
    proc = cli.run("resume", "--code", "current", "gone")
    assert proc.returncode != 0 and "does not exist" in proc.stderr, proc.stderr
    assert _result(cli.run("resume", "--json", "--code", "pinned", "gone")) == expected


def test_a_run_on_pinned_code_killed_again_stays_on_it(tmp_path):
    """Its snapshots name the pinned modules: a plain `tcc resume` continues on them."""
    expected = _uninterrupted(tmp_path, "6")
    cli = Cli(tmp_path)
    script = _project(tmp_path)
    _killed(cli, "again", str(script), "6", after=2)
    _edit(script)
    _killed(cli, "again", "--code", "pinned", "again", after=2, command="resume")
    assert _result(cli.run("resume", "--json", "again")) == expected
    pinned = _code_events(cli, "again")[-1]["modules"]
    assert {e["from"] for e in pinned.values()} == {"__tcc_script_agent", "helpers"}, pinned
    assert all(name.startswith("__tcc_pinned_") for name in pinned)


def test_unchanged_code_resumes_as_usual_with_code_pinned(tmp_path):
    expected = _uninterrupted(tmp_path, "3")
    cli = Cli(tmp_path)
    script = _project(tmp_path)
    _killed(cli, "same", str(script), "3", after=1)
    assert _result(cli.run("resume", "--json", "--code", "pinned", "same")) == expected
    assert not any(n.startswith("__tcc_pinned_") for e in _code_events(cli, "same")
                   for n in e["modules"])


def test_sources_are_stored_once_per_content_across_runs(tmp_path):
    cli = Cli(tmp_path)
    script = _project(tmp_path)
    for run_id in ("one", "two"):
        assert _result(cli.run("run", "--json", "--run-id", run_id, str(script), "2")) == [1, 12]
    one, two = (_code_events(cli, r)[0]["modules"] for r in ("one", "two"))
    assert one == two
    with open_store(str(cli.store), create=False) as store:
        for entry in one.values():
            source = store.get_code(entry["sha256"])
            assert source == pathlib.Path(entry["file"]).read_bytes()
        keys = store._scope.read(lambda txn: [bytes(k) for k, _ in txn.cursor(db=store._scope.dbs["meta"])
                                               if bytes(k).startswith(b"code\x00")])
    assert len(keys) == 2  # two modules, each stored once for both runs


def test_code_stores_refuse_bad_digests_and_say_what_is_missing(tmp_path):
    with open_store(str(tmp_path / "s"), create=True) as store:
        src = b"x = 1\n"
        digest = hashlib.sha256(src).hexdigest()
        with pytest.raises(Exception, match="does not hash to it"):
            store.put_code({digest: b"x = 2\n"})
        with pytest.raises(Exception, match="64 lowercase hex digits"):
            store.put_code({"abc": src})
        with pytest.raises(Exception, match="holds no source with digest"):
            store.get_code(digest)
        store.put_code({digest: src})
        store.put_code({digest: src})  # again: nothing more to write
        assert store.get_code(digest) == src


def test_a_library_outside_the_project_is_never_pinned_and_its_change_is_refused(tmp_path):
    """A frame of a module under site-packages: not recorded; changed, it is named and refused."""
    lib = tmp_path / "venv" / "lib" / "site-packages"
    lib.mkdir(parents=True)
    (lib / "mylib.py").write_text(
        "async def twice(call, i):\n    a = await call(i)\n    return a * 2\n")
    folder = tmp_path / "project"
    folder.mkdir()
    script = folder / "agent.py"
    script.write_text(
        "import tcc\nimport mylib\n\n\n@tcc.effect\ndef step(i):\n    return i\n\n\n"
        "async def main():\n    return [await mylib.twice(step, i) for i in range(4)]\n")
    cli = Cli(tmp_path, PYTHONPATH=str(lib))
    _killed(cli, "lib", str(script), after=2)
    assert set(_code_events(cli, "lib")[0]["modules"]) == {"__tcc_script_agent"}
    (lib / "mylib.py").write_text(
        "async def twice(call, i):\n    a = await call(i + 0)\n    return a * 3\n")
    script.write_text(script.read_text() + "\n# edited\nX = 1\n")
    proc = cli.run("resume", "--code", "pinned", "lib")
    assert proc.returncode == 1
    assert "twice() (" in proc.stderr and "which tcc never pins" in proc.stderr, proc.stderr


def test_a_module_edited_while_the_run_executes_is_recorded_as_stale(tmp_path):
    """What is on disk is not what runs: it is not recorded as the run's code.  (The
    modules loaded at the start are recorded then; `helpers` is imported by the effect
    that then edits it, and the snapshot after finds it changed on disk.)"""
    cli = Cli(tmp_path)
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "helpers.py").write_text(HELPERS)
    script = folder / "agent.py"
    script.write_text(
        "import importlib\nimport pathlib\nimport tcc\n\n\n@tcc.effect\ndef edit():\n"
        "    helpers = importlib.import_module('helpers')\n"
        "    p = pathlib.Path(helpers.__file__)\n    p.write_text(p.read_text().replace('10', '20'))\n\n\n"
        "async def main():\n    await edit()\n    import helpers\n    return helpers.shape(1)\n")
    assert _result(cli.run("run", "--json", "--run-id", "st", str(script))) == 10
    started, later = _code_events(cli, "st")
    assert set(started["modules"]) == {"__tcc_script_agent"} and "stale" not in started
    assert later["modules"] == {} and set(later["stale"]) == {"helpers"}


def test_pinned_resume_on_postgresql(pg_dsn, tmp_path):
    expected = _uninterrupted(tmp_path, "4")
    pg = make_pg_store(pg_dsn, tmp_path / "keys")
    cli = Cli(tmp_path, store_url=pg.url, key_file=pg.key_file)
    script = _project(tmp_path)
    _killed(cli, "pg", str(script), "4", after=2)
    _edit(script)
    assert cli.run("resume", "--code", "current", "pg").returncode == 1
    assert _result(cli.run("resume", "--json", "--code", "pinned", "pg")) == expected


def test_a_dataclass_in_the_state_that_gains_a_field_resumes_on_its_pinned_class(tmp_path):
    """The edit adds `priority` and reads it after the await: the current code would fail
    with AttributeError on the restored instance; the pinned code is the code it was made by."""
    source = (
        "import dataclasses\nimport tcc\n\n\n@dataclasses.dataclass\nclass State:\n    n: int\n\n\n"
        "@tcc.effect\ndef step(i):\n    return i\n\n\n"
        "async def main():\n    state = State(0)\n    for i in range(4):\n"
        "        state.n += await step(i)\n    return state.n\n")
    expected = _result(Cli(tmp_path / "ref").run("run", "--json", str(_write(tmp_path / "ref", source))))
    cli = Cli(tmp_path)
    script = _write(tmp_path, source)
    _killed(cli, "dc", str(script), after=2)
    script.write_text(source.replace("    n: int\n", "    n: int\n    priority: int = 0\n").replace(
        "        state.n += await step(i)\n", "        state.n += await step(i) + state.priority\n"))
    assert cli.run("resume", "--code", "current", "dc").returncode == 1
    assert _result(cli.run("resume", "--json", "--code", "pinned", "dc")) == expected == 6


def _write(folder: pathlib.Path, source: str) -> pathlib.Path:
    (folder / "project").mkdir(parents=True)
    script = folder / "project" / "agent.py"
    script.write_text(source)
    return script


# ------------------------------------------------------- --on-code-change policies


def test_by_default_a_resume_continues_on_the_recorded_code_and_says_so(tmp_path):
    expected = _uninterrupted(tmp_path, "5")
    cli = Cli(tmp_path)
    script = _project(tmp_path)
    _killed(cli, "dflt", str(script), "5", after=2)
    _edit(script)
    proc = cli.run("resume", "--json", "dflt")
    assert _result(proc) == expected
    assert "continues on the code it recorded (agent, helpers changed since)" in proc.stderr, proc.stderr
    assert "`tcc upgrade dflt`" in proc.stderr


def test_the_refuse_policy_refuses_and_the_upgrade_policy_upgrades(tmp_path):
    cli = Cli(tmp_path)
    script = _project(tmp_path)
    _killed(cli, "ref", str(script), "5", "--on-code-change", "refuse", after=2)
    _killed(cli, "upg", str(script), "5", "--on-code-change", "upgrade", after=2)
    started = [e["data"] for e in cli.show("upg")["events"] if e["kind"] == "started"]
    assert started[0]["on_code_change"] == "upgrade"
    # a fix after the await in the script only: the helper stays as it was
    script.write_text(script.read_text().replace("COUNT += 1", "COUNT += 2"))
    refused = cli.run("resume", "ref")
    assert refused.returncode == 1 and "--code pinned ref" in refused.stderr, refused.stderr
    proc = cli.run("resume", "--json", "upg")
    # steps 0 and 1 ran on the old code (COUNT 1, 2); step 1's answer is sent into the new
    # code, which adds 2 from there on
    assert _result(proc) == [0 + 1, 10 + 3, 20 + 5, 30 + 7, 40 + 9], proc.stderr
    assert "was upgraded onto the current code" in proc.stderr
    assert [e["kind"] for e in cli.show("upg")["events"]].count("upgraded") == 1


def test_the_refuse_policy_refuses_an_edit_outside_the_suspended_frames_too(tmp_path):
    """Under --on-code-change refuse, an edit of a helper the suspended frames do not run
    (here `helpers.shape`) was not refused: `tcc ls` said the run needed a decision, but `tcc
    resume` continued it on the edited helper, with no word.  It waits for the decision; each
    one given with `--code` is taken."""
    expected = _uninterrupted(tmp_path, "5")
    cli = Cli(tmp_path)
    script = _project(tmp_path)
    for run_id in ("a", "b"):
        _killed(cli, run_id, str(script), "5", "--on-code-change", "refuse", after=2)
    helpers = script.with_name("helpers.py")
    helpers.write_text(helpers.read_text().replace("v * 10", "v * 100"))
    refused = cli.run("resume", "a")
    assert refused.returncode == 1, refused.stderr
    assert "its code changed since it recorded it (helpers) and its policy is refuse" in refused.stderr
    assert "`tcc resume --code pinned a`" in refused.stderr and "`tcc upgrade a`" in refused.stderr
    assert cli.show("a")["status"] == "running"
    assert _result(cli.run("resume", "--json", "--code", "pinned", "a")) == expected
    current = _result(cli.run("resume", "--json", "--code", "current", "b"))
    assert current == [1, 102, 203, 304, 405], current  # the new helper from the snapshot on


def test_ls_and_show_say_which_runs_code_changed_and_what_a_resume_does(tmp_path):
    cli = Cli(tmp_path)
    script = _project(tmp_path)
    _killed(cli, "keep", str(script), "5", after=2)
    _killed(cli, "stop", str(script), "5", "--on-code-change", "refuse", after=2)
    assert _result(cli.run("run", "--json", "--run-id", "done", str(script), "1")) == [1]
    listing = {r["id"]: r["code_changed"] for r in json.loads(cli.run("ls", "--json", check=True).stdout)}
    assert listing == {"keep": None, "stop": None, "done": None}
    _edit(script)
    listing = {r["id"]: r["code_changed"] for r in json.loads(cli.run("ls", "--json", check=True).stdout)}
    assert listing == {"keep": "pinned", "stop": "refuse", "done": None}
    text = cli.run("ls", check=True).stdout
    assert "[code changed: needs a decision]" in text and "[code changed: continues pinned]" in text
    shown = cli.run("show", "stop", check=True).stdout
    assert "on code change: refuse; changed since recorded: agent.py, helpers.py" in shown, shown
    assert "`tcc resume --code pinned stop`" in shown and "`tcc upgrade stop`" in shown
    code = cli.show("keep")["code"]
    assert code["policy"] == "pinned" and code["changed"] == ["__tcc_script_agent", "helpers"]


def test_a_fork_of_a_run_on_pinned_code_resumes_on_it_too(tmp_path):
    expected = _uninterrupted(tmp_path, "6")
    cli = Cli(tmp_path)
    script = _project(tmp_path)
    _killed(cli, "base", str(script), "6", after=2)
    _edit(script)
    _killed(cli, "base", "base", after=1, command="resume")  # now on its pinned code
    forked = cli.run("fork", "--json", "--run-id", "twin", "base")
    assert forked.returncode == 0, forked.stderr
    assert _result(cli.run("resume", "--json", "twin")) == expected
    assert _result(cli.run("resume", "--json", "base")) == expected


def test_a_fork_after_an_edit_is_taken_on_the_recorded_code_and_keeps_the_policy(tmp_path):
    cli = Cli(tmp_path)
    script = _project(tmp_path)
    _killed(cli, "src", str(script), "5", "--on-code-change", "refuse", after=2)
    _edit(script)
    forked = cli.run("fork", "--json", "--run-id", "copy", "--set", "out=[7]", "src")
    assert forked.returncode == 0, forked.stderr
    forked_event = [e["data"] for e in cli.show("copy")["events"] if e["kind"] == "forked"][0]
    assert forked_event["on_code_change"] == "refuse"
    # taken on the recorded code (--set re-took the snapshot there), it continues on it:
    # out was replaced by [7] where the frame waits (after step 1)
    assert _result(cli.run("resume", "--json", "copy")) == [7, 12, 23, 34, 45]
    # the parent, under its refuse policy, waits for a decision
    assert cli.run("resume", "src").returncode == 1


def test_a_postgresql_store_of_schema_1_is_migrated_to_hold_code(pg_dsn, tmp_path):
    """A database an older tcc made (schema 1, no tcc.code) gains the table when opened."""
    import psycopg

    pg = make_pg_store(pg_dsn, tmp_path / "keys")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE tcc.code")  # what versions 2 and 3 added
        conn.execute("DROP INDEX tcc.runs_wake, tcc.runs_lease, tcc.runs_by_host")
        conn.execute("ALTER TABLE tcc.runs DROP COLUMN wake, DROP COLUMN spawned_by")
        conn.execute("UPDATE tcc.meta SET value = '1' WHERE key = 'schema_version'")
    src = b"x = 1\n"
    digest = hashlib.sha256(src).hexdigest()
    with pg.open() as store:
        store.put_code({digest: src})
        assert store.get_code(digest) == src
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        version = conn.execute("SELECT value FROM tcc.meta WHERE key = 'schema_version'").fetchone()
    assert version == (str(SCHEMA_VERSION),)


SPAWNING = '''\
import tcc


async def child(mode):
    ok = await tcc.approval("child go?") if mode == "wait" else None
    return ["old-child", mode, ok]


async def main(mode):
    ok = await tcc.approval("go?")
    got = await tcc.spawn(child, mode)
    return ["old-main", ok, got]
'''


def _spawning(tmp: pathlib.Path) -> pathlib.Path:
    folder = tmp / "spawning"
    folder.mkdir(parents=True)
    (folder / "agent.py").write_text(SPAWNING)
    return folder / "agent.py"


@pytest.mark.parametrize("policy", ["pinned", "upgrade"])
def test_a_child_spawned_after_an_edit_starts_on_the_code_its_parent_continues_on(tmp_path, policy):
    """The parent parks before its tcc.spawn; the script is edited; the parent continues on
    its recorded code (pinned) and so does the child it then starts, in the same process;
    under the upgrade policy both run the new code."""
    cli = Cli(tmp_path)
    script = _spawning(tmp_path)
    out = cli.run("run", "--run-id", "p", "--on-code-change", policy, str(script), "now")
    assert out.returncode == 0 and "waiting" in out.stdout, out.stdout + out.stderr
    script.write_text(SPAWNING.replace("old-", "new-"))
    cli.run("approve", "p", check=True)
    got = _result(cli.run("resume", "--json", "p"))
    want = "old-" if policy == "pinned" else "new-"
    assert got == [f"{want}main", True, [f"{want}child", "now", None]]
    child = next(e["data"]["child"] for e in cli.show("p")["events"] if e["kind"] == "spawned")
    started = next(e["data"] for e in cli.show(child)["events"] if e["kind"] == "started")
    assert started["on_code_change"] == policy  # the child has its parent's policy


def test_a_pinned_child_that_parks_is_resumed_on_the_recorded_code_in_another_process(tmp_path):
    cli = Cli(tmp_path)
    script = _spawning(tmp_path)
    out = cli.run("run", "--run-id", "q", str(script), "wait")
    assert out.returncode == 0 and "waiting" in out.stdout, out.stdout + out.stderr
    script.write_text(SPAWNING.replace("old-", "new-"))
    cli.run("approve", "q", check=True)
    out = cli.run("resume", "q")  # the child starts on the recorded code, and parks
    assert out.returncode == 0 and "waiting" in out.stdout, out.stdout + out.stderr
    child = next(e["data"]["child"] for e in cli.show("q")["events"] if e["kind"] == "spawned")
    assert cli.show(child)["status"] == "waiting"
    cli.run("approve", child, check=True)
    out = cli.run("resume", "--json", child)
    assert _result(out) == ["old-child", "wait", True]
    assert _result(cli.run("resume", "--json", "q")) == ["old-main", True, ["old-child", "wait", True]]


# ----------------------------- kills in flight, before the first snapshot, and late imports

IN_FLIGHT_AGENT = '''\
import os
import signal

import tcc
import helpers


@tcc.effect
def step(i):
    if os.environ.get("KILL_IN") == str(i) and not os.path.exists(os.environ["MARK"]):
        open(os.environ["MARK"], "w").close()
        os.kill(os.getpid(), signal.SIGKILL)  # in flight: its intent is open, no completion
    return i


async def main(n):
    out = []
    for i in range(int(n)):
        out.append(helpers.shape(await step(i)))
        if i == 1:
            import late  # first imported after the first snapshot, from beside the script
            out.append(late.VALUE)
    return out
'''


def _in_flight_project(tmp: pathlib.Path) -> pathlib.Path:
    folder = tmp / "project"
    folder.mkdir(parents=True)
    (folder / "agent.py").write_text(IN_FLIGHT_AGENT)
    (folder / "helpers.py").write_text(HELPERS)
    (folder / "late.py").write_text("VALUE = 'late'\n")
    return folder / "agent.py"


@pytest.mark.parametrize("options", [(), ("--strategy", "hybrid", "--checkpoint-every", "2")],
                         ids=["continuation", "hybrid"])
@pytest.mark.parametrize("kill_in", [0, 2])
def test_a_run_killed_in_a_call_then_edited_resumes_on_its_recorded_code(tmp_path, options, kill_in):
    """Killed while a call runs (the first call: before any snapshot; or a later one, whose
    open intent follows the snapshot), the helper edited, a plain `tcc resume`: the run ends
    as the original code ends, and says it continues on that code.  (The first used to run
    the edited code quietly; the second stopped for ever on the pinned effect's name.)"""
    reference = _in_flight_project(tmp_path / "reference")
    expected = _result(Cli(tmp_path / "reference").run("run", "--json", *options, str(reference), "4"))
    assert expected == [0, 10, "late", 20, 30]
    script = _in_flight_project(tmp_path)
    cli = Cli(tmp_path, KILL_IN=str(kill_in), MARK=str(tmp_path / "mark"))
    proc = cli.run("run", "--run-id", "k", *options, str(script), "4")
    assert proc.returncode == -9, proc.stderr
    helpers = script.with_name("helpers.py")
    helpers.write_text(helpers.read_text().replace("v * 10", "v * 100"))
    proc = cli.run("resume", "--json", "k")
    assert _result(proc) == expected
    assert "continues on the code it recorded" in proc.stderr


def test_a_module_first_imported_after_the_crash_is_found_beside_the_pinned_script(tmp_path):
    """The run had not imported `late` when it was killed; on its recorded code after an edit
    the import finds the current file beside the script (it used to fail the run)."""
    script = _in_flight_project(tmp_path)
    cli = Cli(tmp_path)
    _killed(cli, "z", str(script), "4", after=1)
    helpers = script.with_name("helpers.py")
    helpers.write_text(helpers.read_text().replace("v * 10", "v * 100"))
    assert _result(cli.run("resume", "--json", "z")) == [0, 10, "late", 20, 30]


def test_a_run_whose_code_cannot_be_recorded_fails_with_the_store_error_alone(tmp_path, monkeypatch):
    """The code is recorded before the agent's coroutine is made: a store failure there (a
    lost database connection) is the one error, with no 'coroutine was never awaited' after."""
    import gc

    from tcc import runtime
    from tcc.errors import StoreError

    script = tmp_path / "unrecorded_code_agent.py"  # (a name no other in-process test loads)
    script.write_text("import tcc\n\n\n@tcc.effect\ndef step(i):\n    return i\n\n\n"
                      "async def main(n):\n    return await step(int(n))\n")
    with open_store(str(tmp_path / "st"), create=True) as store:
        def broken(_sources):
            raise StoreError("the disk went away")

        monkeypatch.setattr(store, "put_code", broken)
        with pytest.raises(StoreError, match="the disk went away"):
            runtime.start(store, str(script), ["2"], run_id="x")
        gc.collect()  # (an unawaited coroutine would warn here; warnings are errors in tests)


NAMED = '''\
import tcc
import helpers


@tcc.effect(timeout=0.2)
def slow(i):
    import time
    time.sleep(2 if i == 1 else 0)
    return tcc.current().effect


async def main(n="3"):
    out = []
    for i in range(int(n)):
        try:
            out.append(helpers.shape(await slow(i)))
        except TimeoutError as exc:
            out.append(str(exc).split(" timed out")[0])
    return out
'''


def test_effect_names_are_the_projects_on_the_recorded_code_too(tmp_path):
    """On its recorded code a run's modules are named ``__tcc_pinned_<hex>_...``; the effect
    name an agent sees (`tcc.current().effect`, tcc's TimeoutError text) and the one the
    journal and `tcc show` hold used to be that pinned name after such a resume."""
    def project(where: pathlib.Path) -> pathlib.Path:
        where.mkdir(parents=True)
        (where / "agent.py").write_text(NAMED)
        (where / "helpers.py").write_text("def shape(v):\n    return v\n")
        return where / "agent.py"

    reference = _result(Cli(tmp_path / "ref").run("run", "--json", str(project(tmp_path / "ref" / "p"))))
    assert reference == ["__tcc_script_agent:slow", "effect '__tcc_script_agent:slow'",
                         "__tcc_script_agent:slow"]
    script = project(tmp_path / "p")
    cli = Cli(tmp_path)
    _killed(cli, "n", str(script), after=1)
    (script.parent / "helpers.py").write_text("def shape(v):\n    return str(v)\n")  # edited
    assert _result(cli.run("resume", "--json", "n")) == reference  # on the recorded helpers
    assert {c["name"] for c in cli.show("n")["calls"]} == {"__tcc_script_agent:slow"}


def _killed_in_call_then_edited(tmp_path, run_id, *options, calls="4"):
    """The in-flight project run as ``run_id`` and SIGKILLed inside call 2, then its helper
    edited (x10 -> x100): (cli, script)."""
    script = _in_flight_project(tmp_path)
    cli = Cli(tmp_path, KILL_IN="2", MARK=str(tmp_path / "mark"))
    proc = cli.run("run", "--run-id", run_id, *options, str(script), calls)
    assert proc.returncode == -9, proc.stderr
    helpers = script.with_name("helpers.py")
    helpers.write_text(helpers.read_text().replace("v * 10", "v * 100"))
    return cli, script


def test_the_upgrade_policy_moves_a_run_killed_in_a_call_after_its_next_snapshot(tmp_path):
    """Under --on-code-change upgrade, a run killed inside a call that follows its newest
    snapshot could not be upgraded (the call belongs to the old code's frame), and every
    resume, and every worker attempt, failed for ever.  It now continues on its recorded
    code until its next snapshot, then moves onto the current code, in one `tcc resume`."""
    cli, _script = _killed_in_call_then_edited(tmp_path, "u", "--on-code-change", "upgrade")
    proc = cli.run("resume", "--json", "u")
    # call 2 is settled on the recorded code, which snapshots at its await; everything after
    # that snapshot runs on the current helpers (x100), as after any upgrade at that point
    assert _result(proc) == [0, 10, "late", 200, 300]
    assert "continues on the code it recorded until its next snapshot" in proc.stderr
    assert "was upgraded onto the current code" in proc.stderr
    kinds = [e["kind"] for e in cli.show("u")["events"]]
    assert "upgraded" in kinds


def test_resume_code_upgrade_moves_a_pinned_run_killed_in_a_call(tmp_path):
    """A run under the default (pinned) policy killed inside a call could not be moved onto
    the new code at all: `tcc upgrade` was refused (the call belongs to the old frame), its
    advice named a policy the run did not have, and `--code current` was refused too.
    `tcc resume --code upgrade` does for one resume what the upgrade policy does."""
    cli, _script = _killed_in_call_then_edited(tmp_path, "p")
    refused = cli.run("upgrade", "p")
    assert refused.returncode != 0 and "`tcc resume --code upgrade p`" in refused.stdout + refused.stderr
    proc = cli.run("resume", "--json", "--code", "upgrade", "p")
    assert _result(proc) == [0, 10, "late", 200, 300]
    assert "was upgraded onto the current code" in proc.stderr


def test_a_run_the_upgrade_policy_moved_stays_on_the_current_code_after_another_crash(tmp_path):
    """The process that ran the recorded code to its next snapshot and upgraded the run still
    had the recorded modules loaded, and its later snapshots named them again: killed after
    the upgrade (or parked and resumed), the run went back to the old code, quietly (or, with
    its entry function edited, could never be restored again)."""
    cli, _script = _killed_in_call_then_edited(tmp_path, "u", "--on-code-change", "upgrade", calls="6")
    killer = Cli.__new__(Cli)
    killer.store, killer.env = cli.store, dict(cli.env, TCC_TEST_KILL_AFTER="2")
    # call 2 on the recorded code (the first leg's only step), the upgrade, then calls 3 and 4
    # on the current code (the second leg's steps): killed there
    proc = killer.run("resume", "u")
    assert proc.returncode == -9 and "was upgraded onto the current code" in proc.stderr, proc.stderr
    shown = cli.show("u")
    assert not any(e["kind"] == "code" and any(n.startswith("__tcc_pinned_") for n in e["data"]["modules"])
                   for e in shown["events"][[e["kind"] for e in shown["events"]].index("upgraded"):]), shown
    proc = cli.run("resume", "--json", "u")
    assert _result(proc) == [0, 10, "late", 200, 300, 400, 500]  # call 5: 50 on the old code
    assert "continues on the code it recorded" not in proc.stderr, proc.stderr
