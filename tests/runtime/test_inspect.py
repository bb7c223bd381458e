"""`tcc inspect`: the frozen call stack of a snapshot, read without running user code."""

from __future__ import annotations

import json
import os
import pathlib
import pickle
import sys

import pytest
from helpers import Cli

from tcc import errors
from tcc.capture import _inspect as insp
from tcc.cli._inspect import inspect_command
from tcc.runtime import _scripts
from tcc.store import open_store

AGENT = '''\
import os

import tcc

MARK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "marker")
with open(MARK, "a") as fh:
    fh.write("module\\n")


def _mark(what):
    with open(MARK, "a") as fh:
        fh.write(what + "\\n")


class Thing:
    def __init__(self, n):
        self.n = n
        self.label = "thing"

    def __repr__(self):
        _mark("repr")
        return f"Thing({self.n})"

    def __reduce__(self):
        _mark("reduce")
        return (Thing, (self.n,), {"label": self.label})

    def __setstate__(self, state):
        _mark("setstate")
        self.__dict__.update(state)


@tcc.effect
def fetch(q):
    return f"result for {q}"


async def deeper(x, thing):
    data = await fetch(x)
    y = [data] * 3
    ok = await tcc.approval("ok?")
    return ok, y


async def helper(name):
    count = 41
    items = {"a": 1, "b": (2, 3)}

    def inner():
        return count + 1

    res = await deeper(name + "!", Thing(7))
    return res, inner()


async def main(topic="t"):
    notes = []
    for i in range(2):
        notes.append(await fetch(i))
    r = await helper(topic)
    return r
'''


def line_of(source: str, text: str) -> int:
    """1-based number of the line of ``source`` that contains ``text``."""
    for number, line in enumerate(source.splitlines(), 1):
        if text in line:
            return number
    raise AssertionError(f"{text!r} not in the agent")


def make_run(tmp: pathlib.Path, stem: str, run_id: str = "insp") -> tuple[Cli, pathlib.Path]:
    """Run the agent until it parks on its approval; return the CLI and the script."""
    script = tmp / f"{stem}.py"
    script.write_text(AGENT)
    cli = Cli(tmp)
    out = json.loads(cli.run("run", "--json", "--run-id", run_id, str(script), check=True).stdout)
    assert out["status"] == "waiting", out
    return cli, script


@pytest.fixture(scope="module")
def parked(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("inspect")
    cli, script = make_run(tmp, "inspect_target_agent")
    marks = (tmp / "marker").read_text().split()
    assert "module" in marks and "reduce" in marks  # the class really is pickled through __reduce__
    return cli, script


def inspect(cli: Cli, script: pathlib.Path, run_id: str = "insp", **kw) -> str:
    """Run inspect_command in-process and check that no user code ran meanwhile."""
    marker = script.parent / "marker"
    marker.unlink(missing_ok=True)
    modules = set(sys.modules)
    unsafe = kw.pop("unsafe", False)
    kw = {"at": None, "as_json": False, "unsafe_repr": False, **kw}
    with open_store(cli.store) as store:
        text = inspect_command(store, run_id, kw.pop("at"), kw.pop("as_json"), kw.pop("unsafe_repr"), **kw)
    if not unsafe:
        assert not marker.exists(), marker.read_text()
        assert not {m for m in set(sys.modules) - modules if m.startswith("__tcc_script_")}
    return text


def test_text_shows_every_frame_with_lines_source_and_locals(parked):
    """The text view lists main, helper and deeper like a traceback, with every local's value."""
    cli, script = parked
    text = inspect(cli, script, color=False)
    src = script.read_text()
    expected = [
        ("main", "r = await helper(topic)"),
        ("helper", 'res = await deeper(name + "!", Thing(7))'),
        ("deeper", 'ok = await tcc.approval("ok?")'),
    ]
    positions = []
    for func, stmt in expected:
        header = f'File "{script}", line {line_of(src, stmt)}, in {func}'
        assert header in text, text
        positions.append(text.index(header))
        assert f"\n    {stmt}\n" in text
    assert positions == sorted(positions)  # outermost first
    for shown in (
        "topic = 't'",
        "notes = ['result for 0', 'result for 1']",
        "i     = 1",
        "r     = <unbound>",
        "name  = 't'",
        "items = {'a': 1, 'b': (2, 3)}",
        "inner = <function helper.<locals>.inner>",
        "res   = <unbound>",
        "count = 41 (cell)",
        "x     = 't!'",
        "thing = <inspect_target_agent.Thing(7) label='thing'>",
        "data  = 'result for t!'",
        "y     = ['result for t!', 'result for t!', 'result for t!']",
        "ok    = <unbound>",
    ):
        assert shown in text, (shown, text)
    assert "waiting for approval 'ok?' (id approval@1)" in text
    assert "CODE CHANGED" not in text and text.count("code unchanged") == 3
    assert "\x1b[" not in text


def test_json_document_lists_frames_locals_and_the_wait(parked):
    """--json gives one document with frames (function, file, line, source, fingerprint, locals) and the wait."""
    cli, script = parked
    doc = json.loads(inspect(cli, script, as_json=True))
    src = script.read_text()
    with open_store(cli.store) as store:
        newest = store.snapshots("insp")[-1].number
    assert doc["run"] == "insp" and doc["snapshot"] == newest and doc["status"] == "waiting"
    frames = doc["frames"]
    assert [f["function"] for f in frames] == ["main", "helper", "deeper"]
    assert [f["line"] for f in frames] == [
        line_of(src, "r = await helper(topic)"),
        line_of(src, "res = await deeper("),
        line_of(src, 'ok = await tcc.approval("ok?")'),
    ]
    assert frames[2]["source"] == 'ok = await tcc.approval("ok?")'
    assert all(f["file"] == str(script) for f in frames)
    assert all(len(f["fingerprint"]) == 32 and f["code_changed"] is False for f in frames)
    assert frames[0]["locals"] == {"topic": "'t'", "notes": "['result for 0', 'result for 1']",
                                   "i": "1", "r": "<unbound>"}
    assert frames[1]["locals"]["count"] == "41" and frames[1]["cells"] == ["count"]
    assert frames[2]["locals"]["y"] == "['result for t!', 'result for t!', 'result for t!']"
    assert frames[2]["unbound"] == ["ok"]
    assert doc["awaiting"]["kind"] == "approval" and doc["awaiting"]["prompt"] == "ok?"


def test_at_shows_an_older_snapshot(parked):
    """--at N shows snapshot N: there deeper still awaits its fetch effect and y is unbound."""
    cli, script = parked
    with open_store(cli.store) as store:
        numbers = [s.number for s in store.snapshots("insp")]
    older = numbers[-2]
    doc = json.loads(inspect(cli, script, at=older, as_json=True))
    assert doc["snapshot"] == older
    deeper = doc["frames"][-1]
    assert deeper["function"] == "deeper"
    assert deeper["line"] == line_of(script.read_text(), "data = await fetch(x)")
    assert deeper["locals"]["data"] == "<unbound>" and deeper["locals"]["y"] == "<unbound>"
    assert doc["awaiting"] == {"kind": "effect", "text": "awaiting effect fetch('t!')",
                               "effect": doc["awaiting"]["effect"], "call": "fetch('t!')"}
    assert doc["pending"] == "resumes by sending 'result for t!' into the innermost frame"
    text = inspect(cli, script, at=older, color=False)
    assert "awaiting effect fetch('t!')" in text
    with pytest.raises(errors.UsageError, match="no snapshot 9999"):
        inspect(cli, script, at=9999)


def test_a_modified_script_is_reported_as_changed(tmp_path):
    """After the script changed, frames whose code changed say so; moved-only frames keep exact lines."""
    cli, script = make_run(tmp_path, "inspect_changed_agent", "chg")
    src = script.read_text()
    src = src.replace("    y = [data] * 3\n", "    y = [data] * 4\n")
    src = src.replace("async def helper(name):", "# two new lines\n\nasync def helper(name):")
    script.write_text(src)
    doc = json.loads(inspect(cli, script, "chg", as_json=True))
    main, helper, deeper = doc["frames"]
    assert main["code_changed"] is False and helper["code_changed"] is False
    assert helper["line"] == line_of(src, "res = await deeper(")  # moved by two lines, still right
    assert main["line"] == line_of(src, "r = await helper(topic)")
    assert deeper["code_changed"] is True
    assert deeper["line"] == line_of(src, "async def deeper(x, thing):")
    text = inspect(cli, script, "chg", color=True)
    assert "CODE CHANGED since the snapshot" in text and "\x1b[" in text
    assert f"fingerprint {deeper['fingerprint'][:12]}" in text.replace("\x1b[2m", "")


def test_unsafe_repr_loads_the_snapshot_and_uses_real_reprs(parked):
    """--unsafe-repr imports the script, loads the snapshot normally and shows real reprs."""
    cli, script = parked
    name = _scripts.module_name(str(script))
    try:
        text = inspect(cli, script, unsafe_repr=True, unsafe=True, color=False)
        assert "thing = Thing(7)" in text, text
        assert "real reprs (--unsafe-repr)" in text
        assert "y     = ['result for t!', 'result for t!', 'result for t!']" in text
        assert "waiting for approval 'ok?'" in text
        marks = (script.parent / "marker").read_text().split()
        assert {"module", "setstate", "repr"} <= set(marks)
    finally:
        sys.modules.pop(name, None)
        if str(script.parent) in sys.path:
            sys.path.remove(str(script.parent))


def test_restricted_unpickler_never_calls_what_the_pickle_names(tmp_path):
    """A payload whose reducer names os.system only yields a stub that recorded the call."""
    target = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {target}",))

    payload = pickle.dumps({"x": Evil(), "when": [1, 2.5, b"b"]}, protocol=5)
    obj = insp.safe_loads(payload)
    assert not target.exists()
    assert insp.stub_name(obj["x"]) in ("posix.system", "os.system", "nt.system")
    assert obj["x"]._tcc_args == (f"touch {target}",)
    assert "'x': <" in insp.safe_repr(obj) and "system(" in insp.safe_repr(obj)
    assert obj["when"] == [1, 2.5, b"b"]
