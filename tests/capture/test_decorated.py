"""Functions of importable modules never travel with a copy of their module's globals.

A decorated function is not what its module holds under its name (the wrapper
is), yet it travels without copies of the globals it uses: a restored frame
updates the module's own state, not stale copies of it, and an edited body is
refused.  Each case dumps in one fresh interpreter and
loads in another, as a crashed agent would be resumed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

AGENT = '''
import functools

CALLS = []
STATE = {"n": 0}


def traced(fn):
    @functools.wraps(fn)
    async def wrapper(*a, **k):
        return await fn(*a, **k)
    return wrapper


def bare(fn):  # no functools.wraps: the inner function cannot be found by name
    async def wrapper(*a, **k):
        return await fn(*a, **k)
    return wrapper


class Req:
    def __init__(self, tag):
        self.tag = tag

    def __await__(self):
        return (yield self)


@traced
async def decorated(x):
    CALLS.append("before")
    v = await Req("d")
    CALLS.append("after")
    STATE["n"] += 1
    return v, len(CALLS), STATE["n"]


async def main():
    result = await decorated(1)
    return result, STATE["n"]


@traced
@traced
async def twice(x):
    v = await Req("t")
    STATE["n"] += 1000
    return v, STATE["n"]


class Agent:
    @classmethod
    @traced
    async def step(cls, x):
        v = await Req("m")
        STATE["n"] += 10
        return v, STATE["n"]


@bare
async def hidden(x):
    v = await Req("h")
    STATE["n"] += 7
    return v, STATE["n"]


def closure():
    async def inner():
        v = await Req("c")
        STATE["n"] += 3
        return v, STATE["n"]
    return inner()


STARTS = {
    "decorated": lambda: decorated(1),
    "main": main,
    "twice": lambda: twice(1),
    "method": lambda: Agent.step(1),
    "hidden": lambda: hidden(1),
    "closure": closure,
}
'''

DUMP = '''
import sys, tcc, agent
task = agent.STARTS[sys.argv[2]]()
task.send(None)
open(sys.argv[1], "wb").write(tcc.dumps(task))
task.close()
'''

LOAD = '''
import json, sys, tcc, agent
agent.STATE["n"] = 100
try:
    task = tcc.loads(open(sys.argv[1], "rb").read())
except tcc.RestoreError as exc:
    print(json.dumps({"refused": type(exc).__name__, "message": str(exc)}))
    sys.exit(0)
try:
    task.send("V")
except StopIteration as stop:
    result = stop.value
print(json.dumps({"result": result, "calls": agent.CALLS, "n": agent.STATE["n"]}))
'''


def run(tmp_path, code, *args):
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]) if proc.stdout.strip() else None


def snapshot(tmp_path, start):
    (tmp_path / "agent.py").write_text(AGENT)
    blob = tmp_path / f"{start}.bin"
    run(tmp_path, DUMP, str(blob), start)
    return blob


def rewrite(path, source):
    path.write_text(source)
    for cached in (path.parent / "__pycache__").glob(path.stem + ".*"):
        cached.unlink()


@pytest.mark.parametrize(
    "start, result, n",
    [
        ("decorated", ["V", 1, 101], 101),
        ("main", [["V", 1, 101], 101], 101),
        ("twice", ["V", 1100], 1100),
        ("method", ["V", 110], 110),
    ],
    ids=["decorated-root", "decorated-inside-chain", "stacked-decorators", "decorated-classmethod"],
)
def test_decorated_function_resumes_against_the_live_module(tmp_path, start, result, n):
    """A decorated coroutine's frame resumes in the loading process's module, not a copy of it."""
    out = run(tmp_path, LOAD, str(snapshot(tmp_path, start)))
    assert out["result"] == result
    assert out["n"] == n
    if start in ("decorated", "main"):
        assert out["calls"] == ["after"]  # "before" went to the dumping process's list


@pytest.mark.parametrize("start", ["decorated", "main"], ids=["root", "inside-chain"])
def test_edited_decorated_function_is_refused(tmp_path, start):
    """Editing a decorated function's body is refused by its code fingerprint, naming it."""
    blob = snapshot(tmp_path, start)
    rewrite(tmp_path / "agent.py", AGENT.replace('STATE["n"] += 1\n', 'STATE["n"] += 2\n'))
    out = run(tmp_path, LOAD, str(blob))
    assert out["refused"] == "CodeChangedError"
    assert "the code of decorated()" in out["message"] and "agent.py" in out["message"]


def test_removed_decorator_is_refused(tmp_path):
    """A snapshot taken inside a decorated function is refused once the decorator is removed."""
    blob = snapshot(tmp_path, "decorated")
    rewrite(tmp_path / "agent.py", AGENT.replace("@traced\nasync def decorated", "async def decorated"))
    out = run(tmp_path, LOAD, str(blob))
    assert out["refused"] == "CodeChangedError"
    assert "decorated" in out["message"]


@pytest.mark.parametrize(
    "start, result", [("hidden", ["V", 107]), ("closure", ["V", 103])], ids=["no-wraps", "closure"]
)
def test_unreachable_module_function_keeps_the_live_module_globals(tmp_path, start, result):
    """A module function that cannot be found by name carries its code, not copies of its globals."""
    out = run(tmp_path, LOAD, str(snapshot(tmp_path, start)))
    assert out["result"] == result
    assert out["n"] == result[1]


def test_inspect_shows_a_decorated_frame_by_reference(tmp_path):
    """tcc inspect reads decorated frames as references and tells which one's code changed."""
    blob = snapshot(tmp_path, "main")
    code = '''
import json, sys, tcc
from tcc.capture import _blob, safe_loads
from tcc.cli._stack import describe
view = safe_loads(_blob.unseal(open(sys.argv[1], "rb").read()))
frames, _awaiting = describe(view, lambda module: sys.argv[2])
print(json.dumps([[f.qualname, f.by_reference, f.code_changed] for f in frames]))
'''
    out = run(tmp_path, code, str(blob), str(tmp_path / "agent.py"))
    assert out == [
        ["main", True, False],
        ["decorated", True, False],  # the wrapper
        ["decorated", True, False],
        ["Req.__await__", True, False],
    ]
    rewrite(tmp_path / "agent.py", AGENT.replace('STATE["n"] += 1\n', 'STATE["n"] += 2\n'))
    out = run(tmp_path, code, str(blob), str(tmp_path / "agent.py"))
    assert [changed for _name, _ref, changed in out] == [False, False, True, False]
