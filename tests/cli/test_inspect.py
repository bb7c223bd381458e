"""`tcc inspect`: the frozen call stack of a snapshot, read without running user code."""

from __future__ import annotations

import collections
import datetime
import decimal
import io
import json
import os
import pathlib
import pickle
import subprocess
import sys
import zoneinfo

import pytest

from tcc import errors
from tcc.capture import _safeload, dump_payload, safe_loads, seal, stub_name
from tcc.cli._inspect import inspect_command
from tcc.cli._safe_repr import safe_repr
from tcc.runtime import _scripts
from tcc.runtime import STATE_TAG
from tcc.store import open_store
from tests._support.runs import Cli

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
    obj = safe_loads(payload)
    assert not target.exists()
    assert stub_name(obj["x"]) in ("posix.system", "os.system", "nt.system")
    assert obj["x"]._tcc_args == (f"touch {target}",)
    assert "'x': <" in safe_repr(obj) and "system(" in safe_repr(obj)
    assert obj["when"] == [1, 2.5, b"b"]


# ------------------------------------------------- values the loader cannot rebuild

KINDS_AGENT = '''\
import collections
import dataclasses
import datetime
import decimal
import enum
import fractions
import os
import pathlib
import re
import uuid
import zoneinfo

import tcc

MARK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "marker")
HISTORY = []
LAST_SEEN = None


def _mark(what):
    with open(MARK, "a") as fh:
        fh.write(what + "\\n")


class Color(enum.Enum):
    RED = 1
    GREEN = 2


@dataclasses.dataclass
class Point:
    x: int
    y: int

    def __repr__(self):
        _mark("repr")
        return "Point!"


@tcc.effect
def act(what):
    return f"did {what}"


async def main():
    global LAST_SEEN
    when = datetime.datetime(2024, 5, 1, 12, 30, tzinfo=zoneinfo.ZoneInfo("UTC"))
    alarm = datetime.time(7, 15, tzinfo=zoneinfo.ZoneInfo("Asia/Tokyo"))
    counts = collections.defaultdict(lambda: 0)
    counts["a"] += 2
    groups = collections.defaultdict(list)
    groups["x"].append(1)
    last = collections.deque([1, 2, 3, 4], maxlen=3)
    price = decimal.Decimal("1.10")
    ratio = fractions.Fraction(3, 4)
    uid = uuid.UUID(int=5)
    path = pathlib.Path("/tmp/x/y.txt")
    color = Color.GREEN
    pt = Point(1, 2)
    ordered = collections.OrderedDict(b=1, a=2)
    tally = collections.Counter("abb")
    day = datetime.date(2024, 1, 2)
    hour = datetime.time(3, 4, tzinfo=datetime.timezone.utc)
    span = datetime.timedelta(days=1, seconds=5)
    pattern = re.compile("a+b", re.IGNORECASE)
    HISTORY.append(await act("prepare"))
    LAST_SEEN = when
    ok = await tcc.approval("go?")
    return [str(when), str(alarm), counts["a"], groups["x"], list(last), str(price), str(uid), ok]
'''


@pytest.fixture(scope="module")
def kinds(tmp_path_factory):
    """A run of KINDS_AGENT parked on its approval, with every hook of its own classes leaving a mark."""
    tmp = tmp_path_factory.mktemp("kinds")
    script = tmp / "kinds_agent.py"
    script.write_text(KINDS_AGENT)
    cli = Cli(tmp)
    out = json.loads(cli.run("run", "--json", "--run-id", "k", str(script), check=True).stdout)
    assert out["status"] == "waiting", out
    return cli, script


KINDS_SHOWN = {
    "when": "datetime.datetime(2024, 5, 1, 12, 30, tzinfo=zoneinfo.ZoneInfo(key='UTC'))",
    "alarm": "datetime.time(7, 15, tzinfo=zoneinfo.ZoneInfo(key='Asia/Tokyo'))",
    "counts": "defaultdict(<function main.<locals>.<lambda>>, {'a': 2})",
    "groups": "defaultdict(<class list>, {'x': [1]})",
    "last": "deque([2, 3, 4], maxlen=3)",
    "price": "Decimal('1.10')",
    "ratio": "Fraction(3, 4)",
    "uid": "UUID('00000000-0000-0000-0000-000000000005')",
    "path": "PosixPath('/tmp/x/y.txt')",
    "color": "<kinds_agent.Color(2)>",
    "pt": "<kinds_agent.Point x=1 y=2>",
    "ordered": "OrderedDict({'b': 1, 'a': 2})",
    "tally": "Counter({'b': 2, 'a': 1})",
    "day": "datetime.date(2024, 1, 2)",
    "hour": "datetime.time(3, 4, tzinfo=datetime.timezone.utc)",
    "span": "datetime.timedelta(days=1, seconds=5)",
    "pattern": "re.compile('a+b', re.IGNORECASE)",
}


def test_values_the_restricted_loader_cannot_rebuild_are_not_called_corrupt(kinds):
    """A snapshot holding a ZoneInfo datetime and a defaultdict(lambda) inspects fine, each value shown by its type."""
    cli, script = kinds
    (script.parent / "marker").unlink(missing_ok=True)
    proc = cli.run("inspect", "k")
    assert proc.returncode == 0, proc.stderr
    for name, shown in KINDS_SHOWN.items():
        assert f"{name.ljust(7)} = {shown}\n" in proc.stdout, (name, proc.stdout)
    assert not (script.parent / "marker").exists()  # Point.__repr__ never ran


def test_json_shows_the_same_values_and_the_module_globals(kinds):
    """--json gives each local of KINDS_AGENT the text's safe repr, and the module globals under "globals"."""
    cli, script = kinds
    doc = json.loads(cli.run("inspect", "--json", "k", check=True).stdout)
    assert doc["awaiting"]["kind"] == "approval", doc  # still parked (the resume test comes later)
    local = doc["frames"][0]["locals"]
    assert {k: local[k] for k in KINDS_SHOWN} == KINDS_SHOWN
    assert doc["globals"]["kinds_agent"]["HISTORY"] == "['did prepare']"
    assert doc["globals"]["kinds_agent"]["LAST_SEEN"] == KINDS_SHOWN["when"]
    text = cli.run("inspect", "k", check=True).stdout
    module_section = text[text.index("Module globals:"):]
    assert "  kinds_agent\n" in module_section and "HISTORY   = ['did prepare']" in module_section
    assert not (script.parent / "marker").exists()


def test_the_snapshot_inspect_reads_is_a_good_one(kinds):
    """The snapshot inspect once called corrupt is resumed by `tcc resume` to completion."""
    cli, _script = kinds
    cli.run("approve", "k", check=True)
    done = json.loads(cli.run("resume", "--json", "k", check=True).stdout.strip().splitlines()[-1])
    assert done["status"] == "completed", done
    assert done["result"][0] == "2024-05-01 12:30:00+00:00", done


def _plant(store_path: pathlib.Path, run_id: str, state) -> None:
    """Store ``state`` (any picklable object) as a new run's only snapshot."""
    with open_store(store_path) as store:
        run = store.create_run("planted_agent.py:main", run_id=run_id)
        store.checkpoint(run_id, run.epoch, seal(dump_payload(state), compress=False))


def _plant_payload(store_path: pathlib.Path, run_id: str, payload: bytes) -> None:
    """Store raw pickle bytes (sealed with a valid digest) as a new run's only snapshot."""
    with open_store(store_path) as store:
        run = store.create_run("planted_agent.py:main", run_id=run_id)
        store.checkpoint(run_id, run.epoch, seal(payload, compress=False))


def test_run_states_of_five_six_and_seven_items_are_read(tmp_path):
    """Snapshots of older tcc (5 or 6 items) and with module globals (7 items) all inspect; globals show."""
    cli = Cli(tmp_path)
    value = {"at": datetime.datetime(2024, 1, 2, tzinfo=zoneinfo.ZoneInfo("UTC")), "n": [1, 2]}
    _plant(cli.store, "five", (STATE_TAG, 1, None, None, 3))
    _plant(cli.store, "six", (STATE_TAG, 2, None, None, 3, {}))
    _plant(cli.store, "seven", (STATE_TAG, 3, None, None, 3, {}, {"__tcc_script_agent": {"STATE": value}}))
    for run_id in ("five", "six", "seven"):
        doc = json.loads(cli.run("inspect", "--json", run_id, check=True).stdout)
        assert doc["frames"] == [] and doc["effect_calls"] == 3
    assert list(doc["globals"]) == ["agent"] and list(doc["globals"]["agent"]) == ["STATE"]
    assert doc["globals"]["agent"]["STATE"].startswith(
        "{'at': datetime.datetime(2024, 1, 2, 0, 0, tzinfo=zoneinfo.ZoneInfo(key='UTC'))")
    text = cli.run("inspect", "seven", check=True).stdout
    assert "Module globals:\n  agent\n    │ STATE = {'at': datetime.datetime(2024, 1, 2, 0, 0" in text
    assert "Module globals" not in cli.run("inspect", "six", check=True).stdout


def test_truncated_snapshot_data_is_still_reported_as_corrupt(tmp_path):
    """A payload cut short (sealed with a valid digest) is corruption, for both the fast and the tolerant loader."""
    cli = Cli(tmp_path)
    when = datetime.datetime(2024, 1, 2, tzinfo=zoneinfo.ZoneInfo("UTC"))  # forces the tolerant loader
    whole = dump_payload((STATE_TAG, 3, None, None, 3, {}, {"m": {"WHEN": when, "L": list(range(50))}}))
    assert safe_loads(whole)[6]["m"]["L"] == list(range(50))
    for cut, run_id in ((len(whole) // 2, "half"), (len(whole) - 1, "nostop")):
        with pytest.raises((pickle.UnpicklingError, EOFError)):
            safe_loads(whole[:cut])
        with pytest.raises((pickle.UnpicklingError, EOFError)):
            _safeload.TolerantUnpickler(io.BytesIO(whole[:cut])).load()
        _plant_payload(cli.store, run_id, whole[:cut])
        proc = cli.run("inspect", run_id)
        assert proc.returncode != 0 and f"run {run_id}: snapshot 1 cannot be read" in proc.stderr, proc.stderr


def test_tolerant_loader_still_calls_nothing_the_pickle_names(tmp_path):
    """With the tolerant loader in use (a ZoneInfo datetime), an os.system reducer still only yields a stub."""
    target = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {target}",))

    class EvilState:
        def __reduce__(self):
            return (datetime.datetime, (b"\x07\xe8\x01\x02\x00\x00\x00\x00\x00\x00", Evil()))

    payload = pickle.dumps({"x": Evil(), "when": EvilState(),
                            "tz": datetime.datetime(2024, 1, 2, tzinfo=zoneinfo.ZoneInfo("UTC"))}, protocol=5)
    with pytest.raises(TypeError):  # the C loader alone calls the snapshot unreadable
        _safeload.SafeUnpickler(io.BytesIO(payload)).load()
    obj = safe_loads(payload)
    assert not target.exists()
    assert stub_name(obj["x"]) in ("posix.system", "os.system", "nt.system")
    assert obj["x"]._tcc_args == (f"touch {target}",)
    assert safe_repr(obj["when"]).startswith("datetime.datetime(2024, 1, 2, 0, 0, tzinfo=<")
    assert safe_repr(obj["tz"]) == "datetime.datetime(2024, 1, 2, 0, 0, tzinfo=zoneinfo.ZoneInfo(key='UTC'))"


def test_a_value_an_allowlisted_type_refuses_is_a_named_stub():
    """A Decimal or deque given a stub argument becomes a '(not rebuilt)' stub with its type's name, not an error."""
    payload = pickle.dumps(
        [_Reduced(decimal.Decimal, (_Reduced(_Unknown, ()),)),
         _Reduced(collections.deque, ([1], _Reduced(_Unknown, ())))], protocol=5)
    dec, dq = safe_loads(payload)
    assert safe_repr(dec) == f"<decimal.Decimal(<{__name__}._Unknown>) (not rebuilt)>"
    assert safe_repr(dq) == f"<collections.deque([1], <{__name__}._Unknown>) (not rebuilt)>"


class _Unknown:
    """A class the restricted loader only knows by name."""


class _Reduced:
    """Pickles as ``func(*args)``."""

    def __init__(self, func, args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


NUMPY_AGENT = '''\
import numpy as np

import tcc


@tcc.effect
def act(what):
    return f"did {what}"


async def main():
    grid = np.arange(12, dtype=np.float64).reshape(3, 4)
    flags = np.array([True, False])
    names = np.array(["a", "bc"])
    big = np.arange(3, dtype=">i4")
    wide = np.arange(6, dtype=np.int16).reshape(2, 3).T
    mixed = np.array([1, None], dtype=object)
    one = np.float64(1.5)
    ok = await tcc.approval("go?")
    return float(grid.sum() + one)
'''


def test_numpy_arrays_show_shape_dtype_and_first_values_without_numpy(tmp_path):
    """A numpy array shows as <numpy.ndarray shape=... dtype=... [values]>, and inspect never imports numpy."""
    pytest.importorskip("numpy")
    script = tmp_path / "numpy_agent.py"
    script.write_text(NUMPY_AGENT)
    cli = Cli(tmp_path)
    cli.run("run", "--run-id", "np", str(script), check=True)
    probe = ("import json, sys\nfrom tcc.cli._inspect import inspect_command\nfrom tcc.store import open_store\n"
             "with open_store(sys.argv[1]) as store:\n"
             "    doc = json.loads(inspect_command(store, 'np', None, True, False))\n"
             "print(json.dumps({'locals': doc['frames'][0]['locals'],"
             " 'numpy': sorted(m for m in sys.modules if m.split('.')[0] == 'numpy')}))\n")
    proc = subprocess.run([sys.executable, "-c", probe, str(cli.store)], capture_output=True, text=True,
                          env=cli.env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["numpy"] == []
    assert out["locals"] == {
        "grid": "<numpy.ndarray shape=(3, 4) dtype=float64 [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, …]>",
        "flags": "<numpy.ndarray shape=(2,) dtype=bool [True, False]>",
        "names": "<numpy.ndarray shape=(2,) dtype=<U2 ['a', 'bc']>",
        "big": "<numpy.ndarray shape=(3,) dtype=>i4 [0, 1, 2]>",
        "wide": "<numpy.ndarray shape=(3, 2) dtype=int16 [0, 3, 1, 4, 2, 5]>",
        "mixed": "<numpy.ndarray shape=(2,) dtype=object [1, None]>",
        "one": "numpy.float64(1.5)",
        "ok": "<unbound>",
    }


PYDANTIC_AGENT = '''\
import pydantic

import tcc


class User(pydantic.BaseModel):
    name: str
    age: int = 0


@tcc.effect
def act(what):
    return f"did {what}"


async def main():
    user = User(name="ann", age=3)
    ok = await tcc.approval("go?")
    return user.name
'''


def test_a_pydantic_model_shows_its_fields(tmp_path):
    """A pydantic model in a local shows as a stub of its class with its field values."""
    pytest.importorskip("pydantic")
    script = tmp_path / "pyd_agent.py"
    script.write_text(PYDANTIC_AGENT)
    cli = Cli(tmp_path)
    cli.run("run", "--run-id", "pd", str(script), check=True)
    doc = json.loads(cli.run("inspect", "--json", "pd", check=True).stdout)
    assert doc["frames"][0]["locals"]["user"] == "<pyd_agent.User name='ann' age=3>"
