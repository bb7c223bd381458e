"""`tcc show`: where a failed run failed, the effect calls it made, and `updated` of a live run."""

from __future__ import annotations

import pathlib
import textwrap
import time

import tcc

from tests._support.runs import Cli

TCC_DIR = pathlib.Path(tcc.__file__).resolve().parent

AGENT = '''
import os
import pathlib
import time

import tcc


@tcc.effect
def lookup(table, key):
    return table[key]


@tcc.effect
def search(query):
    return [query[0], query[-1]]


@tcc.effect(retries=2, retry_delay=0)
def flaky(path):
    n = int(open(path).read()) if os.path.exists(path) else 0
    open(path, "w").write(str(n + 1))
    if n < 2:
        raise ConnectionError(f"attempt {n + 1} failed")
    return n + 1


def pick(d):
    return d["missing_key"]


async def fails_in_agent():
    x = await lookup({"a": 1}, "a")
    return pick({"a": x})


async def helper(d):
    return await lookup(d, "missing_key")


async def fails_in_effect():
    await lookup({"a": 1}, "a")
    return await helper({"a": 1})


class Trap:
    """Unpickling it runs exec (writes TRIP): a loader that runs user code trips it."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (exec, (f"open({self.path!r}, 'w').write('user code ran')",))

    def __repr__(self):
        open(self.path, "w").write("repr ran")
        return "Trap()"


@tcc.effect
def keep(value):
    return value


async def calls(counter, trip):
    a = await search("q1")
    n = await flaky(counter)
    try:
        await lookup({"a": 1}, "missing_key")
    except KeyError:
        pass
    await keep(Trap(trip))
    await tcc.sleep(0)
    return [a, n]


@tcc.effect
def echo(value):
    return value


async def many(n="60"):
    for i in range(int(n)):
        await echo(i)
    return int(n)


@tcc.effect
def block(started, release):
    pathlib.Path(started).write_text("started")
    for _ in range(6000):  # a safety bound: 60 s
        if os.path.exists(release):
            return "released"
        time.sleep(0.01)
    return "gave up"


async def long_effect(started, release):
    return await block(started, release)
'''


def agent(tmp_path: pathlib.Path) -> str:
    path = tmp_path / "show_agent.py"
    path.write_text(textwrap.dedent(AGENT))
    return str(path)


def test_show_reports_where_the_agent_failed(tmp_path):
    """A run that fails in agent code shows its traceback (file, line, function, source) in text and JSON."""
    cli = Cli(tmp_path)
    script = agent(tmp_path)
    assert cli.run("run", "--run-id", "f1", f"{script}:fails_in_agent").returncode == 1
    shown = cli.show("f1")
    assert shown["error"] == "KeyError: 'missing_key'"  # unchanged, for existing readers
    detail = shown["error_detail"]
    assert detail["type"] == "builtins.KeyError" and detail["message"] == "'missing_key'"
    frames = detail["frames"]
    assert [f["function"] for f in frames] == ["fails_in_agent", "pick"]
    assert all(f["file"] == script for f in frames)
    assert frames[-1]["source"] == 'return d["missing_key"]'
    assert frames[0]["source"] == 'return pick({"a": x})'
    line = frames[-1]["line"]
    text = cli.run("show", "f1", check=True).stdout
    assert "Traceback (most recent call last):" in text
    assert f'File "{script}", line {line}, in pick' in text
    assert 'return d["missing_key"]' in text


def test_show_traceback_of_an_effect_error_thrown_into_the_agent(tmp_path):
    """An effect's exception thrown into the agent keeps the agent's frames and the effect's, not tcc's."""
    cli = Cli(tmp_path)
    script = agent(tmp_path)
    assert cli.run("run", "--run-id", "f2", f"{script}:fails_in_effect").returncode == 1
    frames = cli.show("f2")["error_detail"]["frames"]
    assert [f["function"] for f in frames] == ["fails_in_effect", "helper", "lookup"]
    assert all(f["file"] == script for f in frames)
    assert frames[-1]["source"] == "return table[key]"
    assert not any(str(TCC_DIR) in f["file"] for f in frames)


def test_show_lists_the_effect_calls_without_running_user_code(tmp_path):
    """`show` lists each logical call with args, result or error, attempt and duration, and unpickles nothing live."""
    cli = Cli(tmp_path)
    script = agent(tmp_path)
    counter, trip = tmp_path / "count", tmp_path / "TRIP"
    cli.run("run", "--run-id", "c1", f"{script}:calls", str(counter), str(trip), check=True)
    trip.unlink(missing_ok=True)  # the live run may call repr itself; `show` must not
    shown = cli.show("c1")
    calls = shown["calls"]
    assert [c["name"].rpartition(":")[2] for c in calls] == ["search", "flaky", "lookup", "keep", "sleep"]
    search, flaky, lookup, keep, sleep = calls
    assert search["args"] == "'q1'" and search["result"] == "['q', '1']" and search["error"] is None
    assert search["attempt"] == 1 and isinstance(search["duration"], float)
    assert flaky["attempt"] == 3 and flaky["result"] == "3"
    assert [a["error"] for a in flaky["attempts"]] == [
        "ConnectionError('attempt 1 failed')", "ConnectionError('attempt 2 failed')", None]
    assert lookup["error"] == "KeyError('missing_key')" and lookup["result"] is None
    assert "exec(" in keep["args"] and sleep["name"] == "tcc:sleep"  # an inert stub of the call
    text = cli.run("show", "c1", check=True).stdout
    assert not trip.exists(), trip.read_text()
    lines = text.splitlines()
    assert any("search('q1') -> ['q', '1']" in s and "attempt 1" in s for s in lines), text
    assert any("flaky(" in s and "-> 3" in s and "attempt 3" in s for s in lines), text
    assert any("lookup({'a': 1}, 'missing_key')" in s and "KeyError('missing_key')" in s for s in lines), text


def test_show_caps_the_call_listing_but_json_has_all(tmp_path):
    """The text listing shows the last 50 calls and counts the earlier ones; `--json` has every call."""
    cli = Cli(tmp_path)
    script = agent(tmp_path)
    cli.run("run", "--run-id", "m1", f"{script}:many", "60", check=True)
    calls = cli.show("m1")["calls"]
    assert [c["result"] for c in calls] == [str(i) for i in range(60)]
    text = cli.run("show", "m1", check=True).stdout
    assert "10 earlier calls" in text
    assert "echo(10) -> 10" in text and "echo(59) -> 59" in text
    assert "echo(9) -> 9" not in text


def test_updated_advances_while_a_long_effect_runs(tmp_path):
    """A live run's `updated` moves on with its lease renewals, not only at its next commit."""
    cli = Cli(tmp_path)
    script = agent(tmp_path)
    started, release = tmp_path / "started", tmp_path / "release"
    proc = cli.popen("run", "--run-id", "l1", "--lease", "0.6", f"{script}:long_effect",
                     str(started), str(release))
    try:
        deadline = time.monotonic() + 60  # a liveness bound, not a timing assertion
        while not started.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        first = cli.show("l1")
        assert first["status"] == "running"
        later = first
        while later["updated"] <= first["updated"] and time.monotonic() < deadline:
            time.sleep(0.1)
            later = cli.show("l1")
        assert later["updated"] > first["updated"], "updated stood still while the effect ran"
        assert later["status"] == "running"
        release.write_text("go")
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, (out, err)
    finally:
        release.write_text("go")
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert cli.show("l1")["status"] == "completed"

