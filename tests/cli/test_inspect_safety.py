"""`tcc inspect`, `show`, `ls`, the worker and capture hold up against hostile input (issue 25, findings 6-9).

A snapshot is attacker-controlled data as far as `tcc inspect` and `tcc show` are
concerned: they promise to run no code of it, so they must not crash, hang, eat
all memory or read other files because of what it says.  Each test performs the
attack for real -- crafted pickles planted into a real store through the store
API, the real CLI in a subprocess (crash cases always in a subprocess, so that a
signal is seen as a signal) -- and checks the defended outcome.
"""

from __future__ import annotations

import contextlib
import dis
import fractions
import hashlib
import io
import json
import os
import pathlib
import pickle
import pty
import resource
import signal
import subprocess
import sys
import textwrap
import time
from typing import Any

import cloudpickle  # type: ignore[import-untyped]
import pytest

from tcc import errors
from tcc.capture import _blob, _frames, _records, seal
from tcc.capture import code_line, safe_loads
from tcc.runtime import STATE_TAG
from tcc.store import open_store
from tcc.store._api import Completion

# ------------------------------------------------------------------ helpers


class Reduce:
    """Pickles as exactly the ``__reduce__`` tuple it is given: how the attacks are written."""

    def __init__(self, *rv: Any) -> None:
        self.rv = rv

    def __reduce__(self) -> tuple[Any, ...]:
        return self.rv


def tcc(store: pathlib.Path, *args: str, timeout: float = 120, stdin: Any = subprocess.DEVNULL,
        limit_as: int | None = None, env: dict[str, str] | None = None,
        cwd: pathlib.Path | None = None) -> subprocess.CompletedProcess[str]:
    """``tcc COMMAND --store STORE ARGS...`` in a subprocess (optionally with an address-space limit)."""
    def limit() -> None:
        if limit_as is not None:
            resource.setrlimit(resource.RLIMIT_AS, (limit_as, limit_as))

    cmd = [sys.executable, "-m", "tcc", args[0], "--store", str(store), *args[1:]]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=stdin, check=False,
                          env=dict(os.environ, **(env or {})), cwd=cwd,
                          preexec_fn=limit if limit_as is not None else None)


def python(code: str, *args: str, timeout: float = 300, limit_as: int | None = None,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (a crash there is a signal, not a dead test run)."""
    def limit() -> None:
        if limit_as is not None:
            resource.setrlimit(resource.RLIMIT_AS, (limit_as, limit_as))

    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, check=False,
                          text=True, timeout=timeout, env=dict(os.environ, **(env or {})),
                          preexec_fn=limit if limit_as is not None else None)


def not_a_signal(proc: subprocess.CompletedProcess[str]) -> None:
    """The process ended by itself (no SIGSEGV, no abort) and reported no internal error."""
    assert proc.returncode >= 0, (f"killed by {signal.Signals(-proc.returncode).name}",
                                  proc.stdout[-2000:], proc.stderr[-2000:])
    assert proc.returncode != 134, proc.stderr[-3000:]
    assert "internal error" not in proc.stderr and "Fatal Python error" not in proc.stderr, proc.stderr


def plant(store: pathlib.Path, run_id: str, payload: bytes | None = None, *, blob: bytes | None = None,
          entry: str = "planted_agent.py:main") -> None:
    """A new run whose only snapshot is ``payload`` (a pickle, sealed with a valid digest) or ``blob``."""
    with open_store(store) as s:
        run = s.create_run(entry, run_id=run_id)
        s.checkpoint(run_id, run.epoch, blob if blob is not None else seal(payload or b"", compress=False))


def state(coro: Any = None, module_globals: dict[str, Any] | None = None) -> tuple[Any, ...]:
    """A run state as the driver stores it (7 items), with ``coro`` as the root frame."""
    return (STATE_TAG, 3, coro, None, 0, {}, module_globals or {})


def code_args(code: Any) -> tuple[Any, ...]:
    """The constructor arguments tcc stores for a code object (cloudpickle's layout)."""
    return tuple(cloudpickle.cloudpickle._code_reduce(code)[1])


def frame(code: Any, filename: str, offset: int, *, module: str = "planted", slots: tuple[Any, ...] = ()) -> Reduce:
    """A suspended coroutine frame, captured by value, running ``code`` (its args as tcc stores them)."""
    code_obj = Reduce(_records.make_code, (code, filename))
    func = Reduce(cloudpickle.cloudpickle._make_function, (code_obj, {"__name__": module}, "main", None, None))
    record = (1, _frames.SUSPENDED, offset, slots, _records.NULL, "main", "main")
    return Reduce(_records.new_generator, (func, b"\0" * 16, 0), record, None, None, _records.fill_generator)


class Global:
    """A global named (module, name), whatever they contain: written as a raw GLOBAL opcode."""

    def __init__(self, module: str, name: str) -> None:
        self.module, self.name = module, name

    def __call__(self) -> None:  # pickle's save_reduce insists on a callable
        raise AssertionError("never called: only pickled")


class NewObj:
    """``cls.__new__(cls, *args)`` written as the NEWOBJ opcode (pickle itself only writes it for instances of cls)."""

    def __init__(self, cls: Any, *args: Any) -> None:
        self.cls, self.args = cls, args


def hand_pickle(obj: Any) -> bytes:
    """Pickle ``obj`` (protocol 3) with the pure-Python pickler, writing Global and NewObj as raw opcodes."""
    class Hand(pickle._Pickler):  # type: ignore[name-defined,misc]
        def save(self, o: Any, save_persistent_id: bool = True) -> None:
            if isinstance(o, Global):
                self.write(b"c" + o.module.encode() + b"\n" + o.name.encode() + b"\n")
            elif isinstance(o, NewObj):
                self.save(o.cls)
                self.save(o.args)
                self.write(pickle.NEWOBJ)
            else:
                super().save(o, save_persistent_id)

    buf = io.BytesIO()
    Hand(buf, protocol=3).dump(obj)
    return buf.getvalue()


# Control characters that must never reach a terminal raw.
_RAW = [chr(c) for c in range(0x20) if c != 0x0A] + ["\x7f"] + [chr(c) for c in range(0x80, 0xA0)] + [
    "\u2028", "\u2029", "\u202a", "\u202b", "\u202c", "\u202d", "\u202e", "\u2066", "\u2067",
    "\u2068", "\u2069", "\u200e", "\u200f"]


def raw_controls(text: str) -> list[str]:
    """The control characters in ``text`` (as reprs): none may reach a terminal raw."""
    return sorted({repr(c) for c in text if c in _RAW})


# ------------------------------------------------- finding 6: inspect memory safety


def test_a_crafted_code_object_is_never_built_by_inspect(tmp_path: pathlib.Path) -> None:
    """A code object whose bytecode ends in an instruction without its inline caches (heap overflow in CPython's deopt_code) is read inertly."""
    def f(x):  # only its code's layout is used
        return x.attr

    args = list(code_args(f.__code__))
    args[6] = bytes([dis.opmap["RESUME"], 0, dis.opmap["LOAD_ATTR"], 0])  # co_code: the caches are missing
    bad = Reduce(_records.make_code, (tuple(args), str(tmp_path / "agent.py")))
    payload = pickle.dumps(state(frame(tuple(args), str(tmp_path / "agent.py"), 1), {"m": {"CODE": bad}}),
                           protocol=5)
    store = tmp_path / "store"
    plant(store, "code", payload)
    # PYTHONMALLOC=debug turns the out-of-bounds write into a deterministic abort.
    proc = tcc(store, "inspect", "code", env={"PYTHONMALLOC": "debug"})
    not_a_signal(proc)
    assert proc.returncode == 0, proc.stderr
    check = python("""
        import pickle, sys, types
        from tcc.capture import safe_loads
        root = safe_loads(open(sys.argv[1], "rb").read())
        code = root[6]["m"]["CODE"]
        print(type(code).__name__, isinstance(code, types.CodeType), code.co_name, code.co_firstlineno)
    """, str(_write(tmp_path / "payload", payload)), env={"PYTHONMALLOC": "debug"})
    not_a_signal(check)
    _kind, real, co_name, first = check.stdout.split()
    assert real == "False" and co_name == "f" and first == str(f.__code__.co_firstlineno), check.stdout


def _write(path: pathlib.Path, data: bytes) -> pathlib.Path:
    path.write_bytes(data)
    return path


def test_line_numbers_come_from_the_stored_line_table(tmp_path: pathlib.Path) -> None:
    """The inert code view maps every instruction offset to the line and columns CPython itself reports."""
    source = "async def main(a, b):\n    x = a + b\n    y = [x,\n         x * 2]\n    await f(y)\n    return y\n"
    module = compile(source, str(tmp_path / "agent.py"), "exec")
    code = next(c for c in module.co_consts if hasattr(c, "co_code"))
    view = safe_loads(pickle.dumps(Reduce(_records.make_code, (code_args(code), code.co_filename))))
    assert not isinstance(view, type(code))
    real = list(code.co_positions())
    for offset, (line, _end, col, end_col) in enumerate(real):
        got_line, got_cols = code_line(view, offset)
        assert got_line == line, (offset, got_line, line)
        if got_cols is not None:
            assert got_cols == (col, end_col), (offset, got_cols, col, end_col)


def _copyreg(name: str) -> Any:
    import copyreg

    return getattr(copyreg, name)


ATTACKS = {
    "tuple": Reduce(tuple, (Reduce(range, (10**7,)),)),  # 81 bytes -> 420 MB before
    "list": Reduce(list, (Reduce(range, (10**8,)),)),
    "frozenset": Reduce(frozenset, (Reduce(range, (10**8,)),)),
    "bytes": Reduce(bytes, (10**10,)),
    "bytearray": Reduce(bytearray, (10**10,)),
    "newobj_bytes": NewObj(bytes, 10**10),
    "newobj_tuple": NewObj(tuple, Reduce(range, (10**7,))),
    "fraction": Reduce(fractions.Fraction, ("1e-10000000",)),  # 6.7 s before
    "fraction_ints": Reduce(fractions.Fraction, (3**200_000, 7**200_000)),
    "int": Reduce(int, ("9" * 1_000_000,)),
    "reconstructor": Reduce(_copyreg("_reconstructor"), (bytes, bytes, 10**10)),
}


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_work_and_memory_of_allowed_calls_are_bounded(tmp_path: pathlib.Path, name: str) -> None:
    """A tiny pickle asking an allowlisted type for a huge value (10**7 items, 10 GB, 10**10000000) gets a 'too large' stub."""
    payload = hand_pickle(state(None, {"m": {"X": ATTACKS[name], "OK": Reduce(tuple, (Reduce(range, (3,)),))}}))
    if name == "tuple":
        assert len(pickle.dumps(ATTACKS[name], protocol=2)) <= 81
    proc = python("""
        import sys
        from tcc.capture import safe_loads, stub_name
        from tcc.cli._safe_repr import safe_repr
        root = safe_loads(open(sys.argv[1], "rb").read())
        value = root[6]["m"]["X"]
        print(stub_name(value) is not None, type(value).__name__)
        print(safe_repr(value, 300))
        print(root[6]["m"]["OK"])
    """, str(_write(tmp_path / f"{name}.pickle", payload)), timeout=240, limit_as=2 << 30,
                  env={"PYTHONINTMAXSTRDIGITS": "0"})  # what CPython's own guard does not stop
    not_a_signal(proc)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0 and len(lines) == 3, (proc.stdout, proc.stderr[-2000:])
    assert lines[0].startswith("True"), lines
    assert "too large" in lines[1], lines
    assert lines[2] == "(0, 1, 2)", lines  # a small call still builds the real value


def test_repeated_copies_of_one_big_value_stop_at_a_budget(tmp_path: pathlib.Path) -> None:
    """A pickle that copies one memoised 200,000-item list a thousand times (2 GB of copies) stops at the loader's budget."""
    big = list(range(200_000))
    payload = pickle.dumps(state(None, {"m": {"COPIES": [Reduce(tuple, (big,)) for _ in range(1000)]}}),
                           protocol=5)
    assert len(payload) < 2 << 20
    proc = python("""
        import sys
        from tcc.capture import safe_loads, stub_name
        from tcc.cli._safe_repr import safe_repr
        root = safe_loads(open(sys.argv[1], "rb").read())
        copies = root[6]["m"]["COPIES"]
        built = sum(type(c) is tuple for c in copies)
        print(built, sum("too large" in safe_repr(c, 300) for c in copies))
    """, str(_write(tmp_path / "copies.pickle", payload)), limit_as=2 << 30)
    not_a_signal(proc)
    assert proc.returncode == 0, proc.stderr[-2000:]
    built, stubbed = map(int, proc.stdout.split())
    assert 1 <= built < 1000 and built + stubbed == 1000, proc.stdout


def _bomb(size: int, *, content_size: bool = True) -> bytes:
    """A zstandard frame of ``size`` zero bytes, compressed chunk by chunk (a few KB)."""
    import zstandard

    cobj = zstandard.ZstdCompressor(level=3).compressobj(size=size if content_size else -1)
    chunk = bytes(1 << 20)
    return b"".join([cobj.compress(chunk) for _ in range(size >> 20)] + [cobj.flush()])


def _sealed(compressed: bytes) -> bytes:
    """A snapshot envelope around an already compressed payload, with a valid digest."""
    tag = _blob.interpreter_tag()
    digest = hashlib.blake2b(compressed, digest_size=16).digest()
    return _blob._FIXED.pack(_blob.MAGIC, _blob.FORMAT_VERSION, len(tag)) + tag + bytes((_blob.FLAG_ZSTD,)) \
        + digest + compressed


def test_a_decompression_bomb_is_refused_before_it_is_inflated(tmp_path: pathlib.Path) -> None:
    """A 32 KB snapshot record that inflates to 1 GiB is a CorruptSnapshotError, not 1 GB of memory."""
    bomb = _sealed(_bomb(1 << 30))
    assert len(bomb) < 64 << 10
    path = _write(tmp_path / "bomb", bomb)
    proc = python("""
        import sys
        from tcc import errors
        from tcc.capture import unseal
        try:
            unseal(open(sys.argv[1], "rb").read())
        except errors.CorruptSnapshotError as exc:
            print("refused:", exc)
        else:
            print("inflated")
    """, str(path), limit_as=768 << 20)
    not_a_signal(proc)
    assert proc.stdout.startswith("refused:"), (proc.stdout, proc.stderr[-2000:])
    # A frame that does not say its size is cut off at the limit while it inflates.
    unsized = _write(tmp_path / "unsized", _sealed(_bomb(1 << 30, content_size=False)))
    proc = python(proc.args[2], str(unsized), limit_as=768 << 20)
    not_a_signal(proc)
    assert proc.stdout.startswith("refused:"), (proc.stdout, proc.stderr[-2000:])
    store = tmp_path / "store"
    plant(store, "bomb", blob=bomb)
    shown = tcc(store, "inspect", "bomb", limit_as=768 << 20, env={"TCC_STORE_MAP_SIZE": "64M"})
    not_a_signal(shown)
    assert shown.returncode == 1 and "snapshot" in shown.stderr and "MemoryError" not in shown.stderr, shown.stderr


def test_inspect_prints_no_lines_of_files_outside_the_run(tmp_path: pathlib.Path) -> None:
    """A frame whose co_filename names a file outside the run's directory (e.g. /etc/passwd) gets no source lines shown."""
    secret = tmp_path / "secret.txt"
    secret.write_text("TOPSECRET-1 password=hunter2\nTOPSECRET-2\nTOPSECRET-3\n")
    agent_dir = tmp_path / "agent"
    agent_dir.mkdir()
    script = agent_dir / "agent.py"
    script.write_text("async def main():\n    return 1\n")
    module = compile("async def main():\n    await x\n", str(secret), "exec")
    code = next(c for c in module.co_consts if hasattr(c, "co_code"))
    store = tmp_path / "store"
    targets = {"secret": str(secret)}
    if os.path.isfile("/etc/passwd"):
        targets["passwd"] = "/etc/passwd"
    for run_id, filename in targets.items():
        plant(store, run_id, pickle.dumps(state(frame(code_args(code), filename, 2)), protocol=5),
              entry=f"{script}:main")
        proc = tcc(store, "inspect", run_id, cwd=tmp_path)
        doc = tcc(store, "inspect", "--json", run_id, cwd=tmp_path)
        not_a_signal(proc)
        assert proc.returncode == 0 and doc.returncode == 0, proc.stderr
        for out in (proc.stdout, doc.stdout):
            assert "TOPSECRET" not in out and "root:" not in out, out
        assert json.loads(doc.stdout)["frames"][0]["source"] is None
    # the run's own script is still shown
    own = compile(script.read_text(), str(script), "exec")
    own_code = next(c for c in own.co_consts if hasattr(c, "co_code"))
    offset = next(i for i, pos in enumerate(own_code.co_positions()) if pos[0] == 2)
    plant(store, "own", pickle.dumps(state(frame(code_args(own_code), str(script), offset)), protocol=5),
          entry=f"{script}:main")
    doc = json.loads(tcc(store, "inspect", "--json", "own", cwd=tmp_path).stdout)
    assert (doc["frames"][0]["line"], doc["frames"][0]["source"]) == (2, "return 1"), doc


# ------------------------------------------------- finding 7: --unsafe-repr


AGENT = '''\
import os

import tcc

MARK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "imported")
with open(MARK, "a") as fh:
    fh.write("imported\\n")


async def main():
    ok = await tcc.approval("go?")
    return ok
'''


def test_unsafe_repr_needs_an_explicit_yes(tmp_path: pathlib.Path) -> None:
    """`inspect --unsafe-repr` (a full unpickle: any code in the snapshot runs) is refused without --yes off a TTY and asks on one."""
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    store = tmp_path / "store"
    assert tcc(store, "run", "--run-id", "u", str(script)).returncode == 0
    marker = tmp_path / "imported"
    marker.unlink()
    helptext = tcc(store, "inspect", "--help").stdout
    assert "runs any code" in " ".join(helptext.split()), helptext
    refused = tcc(store, "inspect", "--unsafe-repr", "u")
    assert refused.returncode == 2 and "--yes" in refused.stderr, (refused.returncode, refused.stderr)
    assert not marker.exists()
    for answer, imported in ((b"no\n", False), (b"yes\n", True)):
        code, out = _on_a_tty(store, answer, "inspect", "--unsafe-repr", "u")
        assert "type yes" in out, out
        assert marker.exists() is imported, (answer, code, out)
        assert (code == 0) is imported, (answer, code, out)
    marker.unlink()
    allowed = tcc(store, "inspect", "--unsafe-repr", "--yes", "u")
    assert allowed.returncode == 0 and "real reprs" in allowed.stdout, allowed.stderr
    assert marker.exists()


def _on_a_tty(store: pathlib.Path, answer: bytes, *args: str) -> tuple[int, str]:
    """Run tcc with a pseudo-terminal as stdin/stdout/stderr, typing ``answer``; (exit code, output)."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: exec tcc with the terminal
        os.execv(sys.executable, [sys.executable, "-m", "tcc", args[0], "--store", str(store), *args[1:]])
    out = b""
    sent = False
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            data = os.read(fd, 4096)
        except OSError:
            break
        if not data:
            break
        out += data
        if not sent and b"type yes" in out:
            os.write(fd, answer)
            sent = True
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    return os.waitstatus_to_exitcode(status), out.decode(errors="replace")


# ------------------------------------------------- finding 8a: run ids starting with '-'


SLEEPER = '''\
import tcc


async def main():
    await tcc.sleep(0.2)
    return "done"
'''

LEGACY = '''
import sys

import tcc.store._codec as codec

strict = codec.check_name


def lenient(kind, value, **_kw):  # what tcc accepted before ids were checked for a leading '-'
    return strict(kind, value)


for name, module in list(sys.modules.items()):  # tcc.store and each of its modules
    if (name == "tcc.store" or name.startswith("tcc.store.")) and hasattr(module, "check_name"):
        module.check_name = lenient
from tcc.cli._main import main

sys.exit(main(sys.argv[1:]))
'''


def test_run_ids_starting_with_a_dash_are_refused_and_old_ones_still_resume(tmp_path: pathlib.Path) -> None:
    """A new run id '-h' is a usage error naming it; an old run '-h' is resumed by the worker instead of printing help."""
    from tcc.store._codec import check_name

    with pytest.raises(errors.UsageError, match="'-h'"):
        check_name("run id", "-h", new=True)
    assert check_name("run id", "-h") == b"-h"  # an existing run is still found
    script = tmp_path / "agent.py"
    script.write_text(SLEEPER)
    store = tmp_path / "store"
    made = python(LEGACY, "run", "--store", str(store), "--run-id=-h", str(script),
                  env={"TCC_SLEEP_INLINE": "0"})  # park at the sleep: the worker resumes it
    assert made.returncode == 0 and "sleeping until" in made.stdout, (made.stdout, made.stderr)
    time.sleep(0.5)
    worker = tcc(store, "worker", "--once")
    assert worker.returncode == 0, worker.stderr
    shown = tcc(store, "show", "--json", "--", "-h")
    assert shown.returncode == 0 and json.loads(shown.stdout)["status"] == "completed", (
        shown.stdout, worker.stderr)


# ------------------------------------------------- finding 8b: escape sequences


EVIL_AGENT = '''\
import tcc


@tcc.effect
def act(text):
    return text


async def main(mode="fail"):
    await act("\\x1b]0;effect\\x07")
    if mode == "wait":
        return await tcc.approval("go?\\x1b[2J")
    raise ValueError("\\x1b[2J\\x1b]0;owned\\x07\\u202eevil\\x9b31m")
'''


def test_terminal_escapes_in_paths_reasons_and_reprs_are_shown_escaped(tmp_path: pathlib.Path) -> None:
    """Script paths, errors, reasons, class names and file names with escape sequences never reach the terminal raw."""
    folder = tmp_path / "dir\x1b[2J\x1b]0;title\x07\u202e"
    folder.mkdir()
    script = folder / "agent.py"
    script.write_text(EVIL_AGENT)
    store = tmp_path / "store"
    failed = tcc(store, "run", "--run-id", "f", str(script))
    waiting = tcc(store, "run", "--run-id", "w", str(script), "wait")
    assert failed.returncode == 1 and waiting.returncode == 0, (failed.stderr, waiting.stderr)
    cancelled = tcc(store, "cancel", "--reason", "\x1b]0;reason\x07\x1b[2J", "w")
    assert cancelled.returncode == 0, cancelled.stderr
    # a snapshot naming a class, a module and a file with escapes, and a function with an RLO
    evil_code = compile("async def main():\n    await x\n", str(folder / "m\x1b[31m.py"), "exec")
    code = next(c for c in evil_code.co_consts if hasattr(c, "co_code"))
    evil_class = Global("mod\x1b[2J", "Cls\x1b]0;x\x07\u202e")
    evil = Reduce(evil_class, ("\x1b[2J",))
    payload = hand_pickle(state(frame(code_args(code), str(folder / "m\x1b[31m.py"), 2,
                                      module="mod\x1b[1m", slots=(evil, evil_class)),
                                {"m\x1b[5m": {"G\u202e": evil, "C": evil_class}}))
    plant(store, "i", payload, entry=f"{script}:main")
    outputs = {
        "ls": tcc(store, "ls"),
        "show f": tcc(store, "show", "f"),
        "show w": tcc(store, "show", "w"),
        "inspect i": tcc(store, "inspect", "i"),
        "inspect w": tcc(store, "inspect", "w"),
        "run f": failed,
        "run w": waiting,
    }
    for name, proc in outputs.items():
        not_a_signal(proc)
        assert proc.returncode in (0, 1), (name, proc.stderr)
        for stream in (proc.stdout, proc.stderr):
            assert raw_controls(stream) == [], (name, raw_controls(stream), stream)
    assert "\\x1b[2J" in outputs["ls"].stdout  # shown, escaped
    assert "\\x1b]0;reason" in outputs["show w"].stdout


# ------------------------------------------------- finding 9a: paging `tcc show`


def test_show_reads_only_the_calls_it_shows(tmp_path: pathlib.Path) -> None:
    """`tcc show` of a run with 20,000 journal records reads only the tail it lists; --calls/--all-calls page the JSON."""
    from tcc.cli import _render

    store = tmp_path / "store"
    with open_store(store, durability="none") as s:
        run = s.create_run("planted_agent.py:main", run_id="long")
        for i in range(10_000):
            seq = s.append_intent("long", run.epoch, "agent:echo", pickle.dumps(((i,), {})),
                                  idempotency_key=f"long:{i}")
            s.append_completion("long", run.epoch, Completion(seq, result=pickle.dumps(i)))
        s.set_status("long", run.epoch, "completed", result=b'{"value": 1}')

    class Counting:
        """The real store, counting the journal records it hands out."""

        def __init__(self, inner: Any) -> None:
            self.inner, self.read = inner, 0

        def journal(self, run_id: str, *args: Any, **kwargs: Any) -> Any:
            records = self.inner.journal(run_id, *args, **kwargs)
            self.read += len(records)
            return records

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

    with open_store(store) as s:
        counting = Counting(s)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            _render.run_detail(counting, "long", as_json=False)
    text = out.getvalue()
    assert "echo(9999) -> 9999" in text and "echo(9950) -> 9950" in text and "echo(9949)" not in text, text
    assert "20000" in text, text  # the size of the journal is reported
    assert counting.read <= 1000, counting.read
    doc = json.loads(tcc(store, "show", "--json", "--calls", "3", "long").stdout)
    assert [c["result"] for c in doc["calls"]] == ["9997", "9998", "9999"], doc["calls"]
    assert doc["journal_records"] == 20_000
    default = json.loads(tcc(store, "show", "--json", "long").stdout)
    assert 0 < len(default["calls"]) < 10_000 and default["calls"][-1]["result"] == "9999"
    every = json.loads(tcc(store, "show", "--json", "--all-calls", "long").stdout)
    assert len(every["calls"]) == 10_000 and every["calls"][0]["number"] == 1
    assert every["effects"] == 10_000


# ------------------------------------------------- finding 9b: deep object graphs


DEEP = '''
import asyncio, os, sys, threading

import tcc

KEEP = []  # freed by no one: CPython itself may overflow a tiny stack freeing a deep chain

depth, kind, stack = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])


class Reduced:
    def __init__(self, nxt):
        self.nxt = nxt

    def __reduce__(self):
        return (Reduced, (self.nxt,))


class Node:
    def __init__(self, nxt):
        self.nxt = nxt


def build():
    x = None
    for _ in range(depth):
        if kind == "reduced":
            x = Reduced(x)
        elif kind == "object":
            x = Node(x)
        elif kind == "list":
            x = [x]
        elif kind == "closure":
            x = (lambda y: (lambda: y))(x)
    return x


async def agent():
    data = build()
    await asyncio.sleep(0)
    return data


def work():
    coro = agent()
    coro.send(None)
    KEEP.append(coro)
    try:
        blob = tcc.dumps(coro)
    except tcc.CaptureError as exc:
        print("CaptureError", str(exc)[-300:], flush=True)
    else:
        KEEP.append(tcc.loads(blob))
        print("captured", len(blob), flush=True)


threading.stack_size(stack)
t = threading.Thread(target=work)
t.start()
t.join()
os._exit(0)
'''


@pytest.mark.parametrize(("kind", "stack"), [
    ("reduced", 1 << 20), ("object", 1 << 20), ("closure", 1 << 20),
    ("reduced", 256 << 10), ("closure", 256 << 10), ("list", 256 << 10),
])
def test_a_deep_object_graph_in_a_small_thread_stack_is_not_a_crash(kind: str, stack: int) -> None:
    """A 3,000-deep object chain held by a suspended coroutine, dumped in a thread with a small stack, is captured or a CaptureError -- never a signal."""
    proc = python(DEEP, "3000", kind, str(stack))
    not_a_signal(proc)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith(("captured", "CaptureError")), (proc.stdout, proc.stderr[-2000:])
    if proc.stdout.startswith("CaptureError"):
        assert "deep" in proc.stdout, proc.stdout


def test_a_graph_deeper_than_any_stack_allows_is_a_capture_error() -> None:
    """A 100,000-deep chain in a 1 MiB thread is a clean CaptureError that says the graph is too deep."""
    proc = python(DEEP, "100000", "reduced", str(1 << 20))
    not_a_signal(proc)
    assert proc.returncode == 0 and proc.stdout.startswith("CaptureError"), (proc.stdout, proc.stderr[-2000:])
    assert "too deep" in proc.stdout, proc.stdout


# ------------------------------------------------- finding 9c: _diagnose and fake __class__


FAKE_CLASS = '''
import asyncio, threading

import tcc


class Liar:
    """Claims to be a dict (and a coroutine) through __class__; holds what cannot be captured."""

    def __init__(self):
        self.lock = threading.Lock()

    @property
    def __class__(self):
        return dict


class Worse:
    @property
    def __class__(self):
        raise RuntimeError("do not ask")

    def __init__(self):
        self.lock = threading.Lock()


async def agent(kind):
    held = Liar() if kind == "liar" else Worse()
    await asyncio.sleep(0)
    return held


for kind in ("liar", "worse"):
    coro = agent(kind)
    coro.send(None)
    try:
        tcc.dumps(coro)
    except tcc.CaptureError as exc:
        print("CaptureError", exc)
    except Exception as exc:
        print("other", type(exc).__name__, exc)
    coro.close()
'''


def test_objects_that_fake_their_class_do_not_break_the_capture_diagnosis() -> None:
    """An object whose __class__ lies (or raises) still gets a CaptureError naming the lock it holds."""
    proc = python(FAKE_CLASS)
    not_a_signal(proc)
    lines = proc.stdout.splitlines()
    assert len(lines) == 2 and all(line.startswith("CaptureError") for line in lines), (proc.stdout, proc.stderr)
    assert all("lock" in line for line in lines), lines
