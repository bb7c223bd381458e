"""Coverage-guided fuzzing (atheris/libFuzzer) of tcc's decoders of untrusted bytes.

Usage::

    python tests/reliability/fuzz_atheris.py TARGET [libFuzzer flags] [corpus dir | input file...]
    python tests/reliability/fuzz_atheris.py resealed -max_total_time=300
    python tests/reliability/fuzz_atheris.py resealed /tmp/atheris-findings/resealed-X.bin

Targets:

* ``loads``    -- the fuzzer's bytes are a whole snapshot blob for ``tcc.loads``:
  header, interpreter tag, BLAKE2b digest, zstd.  The digest refuses almost
  every mutant, so this target only covers the envelope.
* ``resealed`` -- the fuzzer's bytes are the pickle *payload*; tcc's own
  ``tcc.capture.seal`` wraps them in a correct header and digest, so they
  reach the unpickler, the reconstructors in ``tcc.capture._records``, the
  frame-record validation (``_native.check_frame`` and ``_flow``) and the
  native frame writer.  This is the layer that matters.
* ``record``   -- the store's decoders with a fixed secret.  The first byte
  picks the function: 0 ``Sealer.open`` on raw bytes (the MAC refuses them),
  1 ``Sealer.open`` on a body re-MAC'd with the store's own MAC (reaches the
  JSON header and blob table; ``parse_entries`` then reads an ``m`` blob),
  2 ``decode_chunk``, 3 ``decode_inline`` (where it exists), 4
  ``parse_entries``, 5 ``open_head`` (a run's head record: snapshot index or
  record count) on a re-MAC'd body.  The second byte picks the database name.

A *finding* is any exception other than the documented ones
(:class:`tcc.RestoreError` from ``tcc.loads``, ``Corrupt`` from the store
decoders), an error that C code could only print (``PyErr_Print`` from a
deallocator), and any crash, timeout or out-of-memory that libFuzzer
reports.  Each new finding's input is saved as ``<target>-<Type>-<hash>.bin``
(plus ``.blob``, the sealed snapshot, for ``resealed``) with its traceback and
whether it replays alone in a fresh process in ``.txt``, under
``$TCC_ATHERIS_FINDINGS`` (default ``/tmp/atheris-findings``); libFuzzer's own
``crash-``/``timeout-``/``oom-`` files go there too.  Replaying a saved input
(give its path instead of a corpus directory) prints what each input did.

By default the first finding stops the run with a non-zero exit, as
libFuzzer does.  Environment:

* ``TCC_ATHERIS_KEEP_GOING=1`` -- record each distinct finding (exception
  type and innermost tcc frame) and keep fuzzing.
* ``TCC_ATHERIS_GC=1`` -- collect cyclic garbage after every input, so an
  error printed by a deallocator is blamed on the input that made the object.
* ``TCC_ATHERIS_HISTORY=N`` -- also save the N inputs run before a finding.
* ``TCC_ATHERIS_MEMORY_MB`` (default 1536, 0 lifts it) -- a soft address-space
  limit above what is mapped at start, so that an absurd length field ends as
  ``MemoryError`` (tcc turns that into a ``RestoreError``) instead of
  libFuzzer's out-of-memory kill.
* ``TCC_ATHERIS_RESUME=N`` (``resealed`` only) -- after a load succeeds, run
  the loaded program on for up to N requests (``programs.drive``): the frame
  checks are there so that a restored frame cannot crash the interpreter when
  it resumes, and only resuming it shows whether they suffice.
* ``TCC_ATHERIS_FORGED_CODE=1`` -- see the sandbox below.
* ``TCC_ATHERIS_STATS_SECONDS`` (default 30) -- how often a ``tcc-stats`` line
  (executions, outcomes by kind, refusals, findings) is printed.

Without a corpus directory the script uses ``$TMPDIR/tcc-atheris/TARGET``.
The first corpus directory is seeded with real snapshots (``tcc.dumps`` of
the programs in ``tests/_support/programs.py`` at several suspension points)
or, for ``record``, real sealed records, chunks and manifests.  ``tcc`` and
``cloudpickle`` are instrumented for coverage; ``programs`` is not, so that
its code fingerprints -- and so the saved findings -- are those of a plain
interpreter.

A sandbox (an audit hook, armed once the seeds have loaded) keeps the fuzzed
pickles from touching the machine or the fuzzer: snapshots are pickles and
pickles are code, so a payload may name any callable.  Globals outside
``builtins`` (minus ``eval``/``exec``/``open``/...), ``copyreg``,
``collections``, ``cloudpickle`` (minus its ``subimport``), ``tcc`` and
``programs`` are refused like a missing module; so are new imports, reading
``__globals__`` or frames, process creation, signals, sockets, ctypes, file
writes, and changing the code or defaults of any function that existed before
fuzzing began.  What no audit event reports -- state ``BUILD`` into a class or
function the seeds name -- is put back after each input, so that one input
cannot change how the next one loads.  Code objects whose bytecode and frame
shape differ from the seeds' are refused too, since a forged code object runs
arbitrary bytecode by design (the digest and the store's MAC, not the loader,
keep those out); ``TCC_ATHERIS_FORGED_CODE=1`` lets them through.  Refusals
surface as ``RestoreError`` like any other unloadable snapshot.
"""

from __future__ import annotations

import codecs
import collections
import gc
import hashlib
import importlib.metadata
import os
import pathlib
import resource
import subprocess
import sys
import tempfile
import time
import traceback
import types
import warnings
from typing import Any, Callable

try:
    import atheris
except ImportError:  # pragma: no cover - depends on the interpreter
    sys.exit(
        "fuzz_atheris.py needs atheris (pip install atheris; wheels exist for "
        "CPython 3.11-3.13 on x86_64 Linux)"
    )

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # ``programs`` is pickled as ``tests._support.programs``

# ``programs`` is imported uninstrumented on purpose: its code objects'
# fingerprints are in the seeds, and a saved finding must load in a plain
# interpreter too.
from tests._support import programs  # noqa: E402

with atheris.instrument_imports(include=["tcc", "cloudpickle"]):
    import tcc
    from tcc.capture import dump_payload, seal
    from tcc.store import _chunks
    from tcc.store import _heads
    from tcc.store._codec import Corrupt, Sealer, seq_key

TARGETS = ("loads", "resealed", "record")
FINDINGS = pathlib.Path(os.environ.get("TCC_ATHERIS_FINDINGS", "/tmp/atheris-findings"))
KEEP_GOING = os.environ.get("TCC_ATHERIS_KEEP_GOING", "") not in ("", "0")
FORGED_CODE = os.environ.get("TCC_ATHERIS_FORGED_CODE", "") not in ("", "0")
COLLECT = os.environ.get("TCC_ATHERIS_GC", "") not in ("", "0")
MEMORY_MB = int(os.environ.get("TCC_ATHERIS_MEMORY_MB", "1536"))
HISTORY = int(os.environ.get("TCC_ATHERIS_HISTORY", "0"))
RESUME = int(os.environ.get("TCC_ATHERIS_RESUME", "0"))
STATS_EVERY = float(os.environ.get("TCC_ATHERIS_STATS_SECONDS", "30"))

SECRET = bytes(range(32))  # fixed, so findings replay
SEALER = Sealer(SECRET)
DBS = (b"runs", b"journal", b"snaps", b"signals", b"events", b"chunks")
KEY = seq_key(b"tenant", b"run-1", 1)
_decode_inline: Callable[[bytes, int], bytes] | None = getattr(_chunks, "decode_inline", None)
_open_head: Callable[..., Any] | None = getattr(_heads, "open_head", None)  # store format 3


# --------------------------------------------------------------------- sandbox


class SandboxImportRefused(ImportError):
    """The fuzzed pickle named a global outside the sandbox's allow-list."""


class SandboxDenied(PermissionError):
    """The fuzzed pickle tried a side effect the sandbox forbids."""


_MODULES = ("builtins", "copyreg", "collections", programs.__name__)
_MODULE_PREFIXES = ("tcc.", "cloudpickle", "collections.")
_BUILTINS_DENIED = frozenset(
    "eval exec compile open input __import__ breakpoint exit quit help globals locals "
    "vars setattr delattr print __build_class__ copyright credits license".split()
)
# Ways from an allowed global to any module: cloudpickle's own importers, and
# the globals, builtins and frames reachable from functions and generators.
_GLOBALS_DENIED = frozenset({"subimport", "dynamic_subimport"})
_ATTRS_DENIED = frozenset(
    "__globals__ __builtins__ f_globals f_locals f_builtins f_back tb_frame gi_frame "
    "cr_frame ag_frame".split()
)
_DENIED_EVENTS = frozenset(
    "os.system subprocess.Popen os.exec os.posix_spawn os.spawn os.fork os.forkpty "
    "os.kill os.killpg os.remove os.rmdir os.rename os.link os.symlink os.mkdir "
    "os.chmod os.chown os.truncate os.utime os.chdir os.chflags os.putenv os.unsetenv "
    "os.setxattr os.removexattr os.add_dll_directory shutil.rmtree shutil.copyfile "
    "shutil.copymode shutil.copystat shutil.move shutil.make_archive shutil.unpack_archive "
    "builtins.input builtins.breakpoint webbrowser.open sys.addaudithook sys.settrace "
    "sys.setprofile signal.pthread_kill exec compile "
    "glob.glob tempfile.mkstemp tempfile.mkdtemp pty.spawn".split()
)
_DENIED_PREFIXES = ("socket.", "ctypes.", "sqlite3.", "urllib.", "http.", "ftplib.", "smtplib.",
                    "telnetlib.", "imaplib.", "nntplib.", "poplib.", "winreg.", "msvcrt.")
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


class Sandbox:
    """An audit hook: learns what the seeds use, then refuses side effects."""

    def __init__(self) -> None:
        self.armed = False
        self.code_ok: set[tuple[Any, ...]] = set()
        self.globals_used: set[tuple[str, str]] = set()
        self.frozen: set[int] = set()  # ids of the functions and classes alive when armed
        self._keep: list[Any] = []  # ... kept alive, so that no id is reused
        self.denied: collections.Counter[str] = collections.Counter()

    def freeze(self) -> None:
        """Refuse changes to every function and class that exists now."""
        self._keep = [o for o in gc.get_objects() if isinstance(o, (types.FunctionType, type))]
        self.frozen = {id(o) for o in self._keep}

    def hook(self, event: str, args: tuple[Any, ...]) -> None:
        if event == "code.__new__":
            sig = (args[0], *args[2:])  # bytecode, name, counts, stack size, flags
            if not self.armed:
                self.code_ok.add(sig)
            elif not FORGED_CODE and sig not in self.code_ok:
                self._deny(event, SandboxDenied("forged code object"))
            return
        if not self.armed:
            if event == "pickle.find_class":
                self.globals_used.add(args)
            return
        if event == "pickle.find_class":
            module, name = args
            if module == "builtins":
                if name in _BUILTINS_DENIED:
                    self._deny(event, SandboxImportRefused(f"builtins.{name} is not allowed"))
            elif module not in _MODULES and not module.startswith(_MODULE_PREFIXES):
                self._deny(event, SandboxImportRefused(f"module {module!r} is not allowed"))
            elif name in _GLOBALS_DENIED:
                self._deny(event, SandboxImportRefused(f"{module}.{name} is not allowed"))
        elif event in ("object.__setattr__", "object.__delattr__"):
            if id(args[0]) in self.frozen:  # e.g. programs.deep.__code__ = ...
                self._deny(event, SandboxDenied(f"changing .{args[1]} of {args[0]!r}"))
        elif event == "object.__getattr__":
            if args[1] in _ATTRS_DENIED:
                self._deny(event, SandboxDenied(f"reading .{args[1]}"))
        elif event == "import":
            self._deny(event, SandboxImportRefused(f"no new imports ({args[0]!r})"))
        elif event == "open":
            path, mode, flags = args
            if (
                not isinstance(path, (str, bytes))
                or os.fsdecode(path).startswith("/dev/")
                or (isinstance(mode, str) and any(c in mode for c in "wax+"))
                or (isinstance(flags, int) and flags & _WRITE_FLAGS)
            ):
                self._deny(event, SandboxDenied(f"open({path!r}, {mode!r}, {flags!r})"))
        elif event in _DENIED_EVENTS or event.startswith(_DENIED_PREFIXES):
            self._deny(event, SandboxDenied(event))

    def _deny(self, event: str, exc: Exception) -> None:
        self.denied[event] += 1
        raise exc


_MISSING = object()


class Pristine:
    """Undo what a fuzzed pickle did to the classes and functions it can name.

    A pickle may ``BUILD`` state into any object it can name -- a class of the
    test programs, say -- and no audit event reports that.  Left alone, one
    input would change how every later input loads, and findings would not
    replay.  The namespaces of the seeds' globals and of every class and
    function in ``programs`` are compared after each input and put back.
    """

    def __init__(self, sandbox: Sandbox) -> None:
        objs: dict[int, Any] = {}
        for module, qualname in sandbox.globals_used:
            obj: Any = sys.modules.get(module)
            for part in qualname.split("."):
                obj = getattr(obj, part, None)
            objs[id(obj)] = obj
        for obj in vars(programs).values():
            if isinstance(obj, (type, types.FunctionType)) and obj.__module__ == programs.__name__:
                objs[id(obj)] = obj
        # Only what has a writable namespace: classes defined in Python, functions.
        self.saved = [
            (obj, dict(vars(obj)), getattr(obj, "__name__", None))
            for obj in objs.values()
            if isinstance(obj, types.FunctionType)
            or (isinstance(obj, type) and obj.__flags__ & _HEAPTYPE)
        ]
        self.restored = 0

    def restore(self) -> None:
        for obj, saved, name in self.saved:
            now = vars(obj)
            if len(now) == len(saved) and all(now.get(k, _MISSING) is v for k, v in saved.items()):
                if getattr(obj, "__name__", None) is name:
                    continue
            self.restored += 1
            for key in [k for k in now if k not in saved]:
                delattr(obj, key)
            for key, value in saved.items():
                if now.get(key, _MISSING) is not value:
                    setattr(obj, key, value)
            obj.__name__ = name


_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE


SANDBOX = Sandbox()


# ----------------------------------------------------------------- the targets


def target_loads(data: bytes) -> Any:
    return tcc.loads(data)


def target_resealed(data: bytes) -> Any:
    obj = tcc.loads(seal(data))
    if RESUME:
        resume(obj)
    return obj


RESUMED: collections.Counter[str] = collections.Counter()


def resume(obj: Any) -> None:
    """Run a loaded ``(task, pending reply)`` on for up to ``RESUME`` requests.

    The record validation exists so that a restored frame cannot crash the
    interpreter when it *resumes*; only running it shows that.  Exceptions
    from the resumed program are its own business (a mutated local makes it
    raise, as a real program would): counted, not findings.  Crashes are.
    """
    if not (isinstance(obj, tuple) and len(obj) == 2):
        return
    task, reply = obj
    if not isinstance(task, (types.GeneratorType, types.CoroutineType)):
        return
    try:
        trace, _ = programs.drive(task, first=reply, limit=RESUME)
    except Exception as exc:  # noqa: BLE001 - see the docstring
        RESUMED[f"raised {type(exc).__name__}"] += 1
    else:
        RESUMED["ran" if len(trace) < RESUME else "still suspended"] += 1


def target_record(data: bytes) -> Any:
    if len(data) < 2:
        return None
    mode, db, rest = data[0] % 6, DBS[data[1] % len(DBS)], data[2:]
    if mode == 0:
        return SEALER.open(db, KEY, rest)
    if mode == 1:
        # Re-MAC the fuzzer's body with the store's own MAC so it gets past
        # verification, as a record written by tcc (or with the secret) would.
        header, blobs = SEALER.open(db, KEY, SEALER._mac(db, KEY, rest) + rest)
        if "m" in blobs:
            _chunks.parse_entries(blobs["m"])
        return header
    raw_len = int.from_bytes(rest[:4].ljust(4, b"\0"), "little")
    if mode == 2:
        return _chunks.decode_chunk(SEALER, rest[4:36], rest[36:], raw_len)
    if mode == 3 and _decode_inline is not None:
        return _decode_inline(rest[4:], raw_len)
    if mode == 5 and _open_head is not None:
        pfx = KEY[:-8]
        key = _heads.head_key(db.decode(), pfx)
        return _open_head(SEALER, db.decode(), pfx, SEALER._mac(db, key, rest) + rest)
    return _chunks.parse_entries(rest)


RUN: dict[str, Callable[[bytes], Any]] = {
    "loads": target_loads,
    "resealed": target_resealed,
    "record": target_record,
}
ALLOWED: dict[str, tuple[type[BaseException], ...]] = {
    "loads": (tcc.RestoreError,),
    "resealed": (tcc.RestoreError,),
    "record": (Corrupt,),
}


# ---------------------------------------------------------------------- seeds


def snapshot_seeds() -> dict[str, bytes]:
    """Pickle payloads of every test program at a few suspension points."""
    out: dict[str, bytes] = {}
    for name in sorted(programs.PROGRAMS):
        trace, _ = programs.drive(programs.PROGRAMS[name]())
        for k in sorted({0, 1, len(trace) // 2, len(trace)}):
            task = programs.PROGRAMS[name]()
            pending = programs.advance(task, k)
            out[f"{name}-{k}"] = dump_payload((task, pending))
            programs.drive(task, first=pending)  # finish it: no finaliser runs its cleanup
    return out


def record_seeds() -> dict[str, bytes]:
    """Real sealed records, stored chunks and manifests, prefixed for ``target_record``."""
    out: dict[str, bytes] = {}
    payload = next(iter(snapshot_seeds().values())) * 8
    pieces = _chunks.split(SEALER, payload)
    entries = [(i + 1, addr, len(piece)) for i, (addr, piece) in enumerate(pieces)]
    manifest = _chunks.pack_entries(entries)
    records = {
        b"snaps": ({"j": 3, "s": len(payload), "t": 1.5, "g": 0}, {"m": manifest}),
        b"journal": ({"k": "effect", "n": "act", "st": "done"}, {"a": b"args", "r": b"result"}),
        b"signals": ({"s": "pending", "t": 2.0}, {"v": b"value"}),
        b"events": ({"k": "resumed", "t": 3.0, "d": {"epoch": 2}}, None),
        b"runs": ({"st": "running", "e": 1, "n": [1, 2]}, {"x": b"\0" * 3}),
    }
    for db, (header, blobs) in records.items():
        value = SEALER.seal(db, KEY, header, blobs)
        out[f"open-raw-{db.decode()}"] = bytes([0, DBS.index(db)]) + value
        out[f"open-remac-{db.decode()}"] = bytes([1, DBS.index(db)]) + value[16:]
    for n, (addr, piece) in enumerate(pieces[:3]):
        stored = _chunks.encode_chunk(piece)
        head = len(piece).to_bytes(4, "little")
        out[f"chunk-{n}"] = bytes([2, 5]) + head + addr + stored
        out[f"inline-{n}"] = bytes([3, 5]) + head + stored
    out["entries"] = bytes([4, 2]) + manifest
    if _open_head is not None:
        pfx = KEY[:-8]
        for db, n in ((b"snaps", {"n": [1, 4, 5], "j": 9}), (b"journal", 7), (b"runs", 2)):
            head = _heads.seal_head(SEALER, db.decode(), pfx, n)
            out[f"head-{db.decode()}"] = bytes([5, DBS.index(db)]) + head[16:]
    return out


def make_seeds(target: str) -> dict[str, bytes]:
    if target == "record":
        return record_seeds()
    payloads = snapshot_seeds()
    return payloads if target == "resealed" else {k: seal(v) for k, v in payloads.items()}


def write_seeds(seeds: dict[str, bytes], corpus: pathlib.Path) -> None:
    corpus.mkdir(parents=True, exist_ok=True)
    for name, data in seeds.items():
        path = corpus / f"seed-{name}"
        if not path.exists():
            path.write_bytes(data)


# -------------------------------------------------------------------- running


# CPython (3.11-3.13 at least) bug, not tcc's: when ``PyByteArray_FromStringAndSize``
# cannot allocate (the unpickler's BYTEARRAY8 with an absurd length), it
# deallocates the half-made object before setting ``ob_exports``, and the
# deallocator prints this if the uninitialised field happens to be non-zero.
# Reproducer without tcc: dirty 56-byte blocks (``[b"\xff" * 24 for _ in
# range(50)]``), then ``pickle.loads(b"\x80\x05\x96" + (2**62).to_bytes(8,
# "little"))``.  Counted, not reported, for inputs holding a BYTEARRAY8 opcode.
_CPYTHON_BYTEARRAY_NOISE = "deallocated bytearray object has exported buffers"


class Harness:
    """Runs one target on one input; classifies the outcome; saves findings."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.run = RUN[target]
        self.allowed = ALLOWED[target]
        self.pristine: Pristine | None = None
        self.outcomes: collections.Counter[str] = collections.Counter()
        self.findings: collections.Counter[str] = collections.Counter()
        self.unraisable = 0
        self.known_noise = 0
        self.printed: list[BaseException] = []  # errors C code reported with PyErr_Print
        self.execs = 0
        self.history: collections.deque[bytes] = collections.deque(maxlen=HISTORY or 1)
        self.verbose = False  # replaying given inputs: say what each one did
        self.running = False  # inside __call__: errors C code prints belong to the input
        self.started = time.monotonic()
        self.next_stats = self.started + STATS_EVERY

    def __call__(self, data: bytes) -> None:
        self.running = True
        try:
            self.one(data)
        finally:
            self.running = False

    def one(self, data: bytes) -> None:
        SANDBOX.armed = True  # here, not before atheris.Fuzz(), which imports its core lazily
        self.execs += 1
        if HISTORY:
            self.history.append(data)
        try:
            result = self.run(data)
        except self.allowed as exc:
            words = " ".join(str(exc).split()[:4])
            self.outcomes[f"{type(exc).__name__}: {words}"] += 1
            if self.verbose:
                print(f"outcome: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        except BaseException as exc:  # noqa: BLE001 - every other exception is a finding
            self.finding(data, exc)
            if not KEEP_GOING or not isinstance(exc, Exception):
                SANDBOX.armed = False  # atheris formats the traceback: frames, source
                raise
        else:
            self.outcomes["accepted"] += 1
            if self.verbose:
                print(f"outcome: accepted ({type(result).__name__})", file=sys.stderr, flush=True)
            del result  # finalisers of loaded frames run here, inside the sandbox
        if COLLECT:
            gc.collect()  # cyclic garbage dies now, so what it prints is blamed on this input
        if self.printed:
            self.printed_error(data)
        if self.pristine is not None:
            SANDBOX.armed = False
            self.pristine.restore()
            SANDBOX.armed = True
        if time.monotonic() >= self.next_stats:
            self.stats()

    def printed_error(self, data: bytes) -> None:
        # C code that cannot raise (a deallocator, say) prints the error via
        # sys.excepthook instead.
        exc, self.printed = self.printed[0], []
        if str(exc) == _CPYTHON_BYTEARRAY_NOISE and b"\x96" in data:
            self.known_noise += 1
            if self.known_noise <= 3:  # say where, in case it is not the BYTEARRAY8 path
                notes = "".join(getattr(exc, "__notes__", ()))
                print(f"known CPython noise: {exc}\n{notes}", file=sys.stderr, flush=True)
            return
        self.finding(data, exc)
        if not KEEP_GOING:
            SANDBOX.armed = False
            raise exc

    def finding(self, data: bytes, exc: BaseException) -> None:
        armed, SANDBOX.armed = SANDBOX.armed, False  # the report reads source files
        try:
            frames = traceback.extract_tb(exc.__traceback__)
            ours = [f for f in frames if f"{os.sep}tcc{os.sep}" in f.filename] or frames
            where = f"{ours[-1].name}:{ours[-1].lineno}" if ours else "?"
            sig = f"{type(exc).__name__} at {where}"
            self.findings[sig] += 1
            if self.findings[sig] > 1:
                return
            digest = hashlib.sha1(sig.encode()).hexdigest()[:10]
            base = FINDINGS / f"{self.target}-{type(exc).__name__}-{digest}"
            FINDINGS.mkdir(parents=True, exist_ok=True)
            base.with_suffix(".bin").write_bytes(data)
            if self.target == "resealed":
                base.with_suffix(".blob").write_bytes(seal(data))  # for tcc.loads directly
            if HISTORY:  # the inputs that ran before, oldest first: replay them in order
                hist = base.with_suffix(".history")
                hist.mkdir(exist_ok=True)
                for i, old in enumerate(self.history):
                    (hist / f"{i:06d}").write_bytes(old)
            replay = [sys.executable, os.path.abspath(__file__), self.target, f"{base}.bin"]
            text = "".join(traceback.format_exception(exc))
            alone = self.replays_alone(replay)
            base.with_suffix(".txt").write_text(
                f"target: {self.target}\nsignature: {sig}\ninput: {base}.bin ({len(data)} bytes)\n"
                f"found after: {self.execs} inputs, {time.monotonic() - self.started:.0f} s\n"
                f"replay: {' '.join(replay)}\nreplays alone in a fresh process: {alone}\n\n{text}"
            )
            print(
                f"\n=== FINDING {sig} (replays alone: {alone}): saved {base}.bin\n{text}",
                file=sys.stderr,
                flush=True,
            )
        finally:
            SANDBOX.armed = armed

    def replays_alone(self, command: list[str]) -> str:
        """Whether the input alone, in a fresh process, gives a finding too."""
        if os.environ.get("TCC_ATHERIS_REPLAYING"):
            return "(this is the replay)"
        env = dict(os.environ, TCC_ATHERIS_REPLAYING="1", TCC_ATHERIS_KEEP_GOING="0",
                   TCC_ATHERIS_FINDINGS=tempfile.mkdtemp(prefix="tcc-atheris-replay-"))
        try:
            proc = subprocess.run(command, env=env, capture_output=True, timeout=300)
        except subprocess.TimeoutExpired:
            return "timed out"
        return f"{'yes' if proc.returncode else 'no'} (exit {proc.returncode})"

    def stats(self) -> None:
        self.next_stats = time.monotonic() + STATS_EVERY
        armed, SANDBOX.armed = SANDBOX.armed, False
        with open("/proc/self/status") as f:
            rss = next((line.split()[1] for line in f if line.startswith("VmRSS:")), "?")
        top = ", ".join(f"{k!r}: {v}" for k, v in self.outcomes.most_common(8))
        print(
            f"tcc-stats target={self.target} execs={self.execs} "
            f"seconds={time.monotonic() - self.started:.0f} rss_kb={rss} "
            f"findings={dict(self.findings)} unraisable={self.unraisable} "
            f"known_cpython_noise={self.known_noise} "
            f"restored={self.pristine.restored if self.pristine else 0} "
            f"denied={dict(SANDBOX.denied)} resumed={dict(RESUMED)} outcomes={{{top}}}",
            file=sys.stderr,
            flush=True,
        )
        SANDBOX.armed = armed


def limit_memory() -> None:
    """Let an absurd length field end as MemoryError (as tcc expects), not as an OOM kill.

    The (soft) address-space limit is what is mapped now plus
    ``TCC_ATHERIS_MEMORY_MB``: a pickle's ``LONG_BINPUT 1259179156`` otherwise
    grows the unpickler's memo table to 10 GB and touches all of it.
    """
    if MEMORY_MB <= 0:
        return
    with open("/proc/self/status") as f:
        mapped_kb = next(int(line.split()[1]) for line in f if line.startswith("VmSize:"))
    limit = mapped_kb * 1024 + (MEMORY_MB << 20)
    _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[1] not in TARGETS:
        targets = "|".join(TARGETS)
        sys.exit(f"usage: {argv[0]} {{{targets}}} [libFuzzer flags] [corpus dir | inputs]")
    target, rest = argv[1], argv[2:]
    positional = [a for a in rest if not a.startswith("-")]
    if not positional:
        corpus = pathlib.Path(tempfile.gettempdir()) / "tcc-atheris" / target
        rest.append(str(corpus))
        positional = [str(corpus)]
    flags = {a.split("=", 1)[0] for a in rest if a.startswith("-")}
    if "-artifact_prefix" not in flags:
        FINDINGS.mkdir(parents=True, exist_ok=True)
        rest.append(f"-artifact_prefix={FINDINGS}/{target}-")
    if "-timeout" not in flags:
        rest.append("-timeout=30")

    limit_memory()
    first = pathlib.Path(positional[0])
    seeds = make_seeds(target)
    if not first.is_file():  # a file means: replay the given inputs
        write_seeds(seeds, first)

    harness = Harness(target)
    harness.verbose = first.is_file()
    warnings.simplefilter("ignore")  # "coroutine was never awaited" from refused mutants

    def unraisable(_info: Any) -> None:  # a loaded mutant's finaliser raised: counted only
        harness.unraisable += 1

    def excepthook(kind: Any, value: BaseException, tb: Any) -> None:
        if not harness.running:  # atheris reporting an uncaught exception, say
            sys.__excepthook__(kind, value, tb)
            return
        # No traceback comes with it: note where Python was when C printed it.
        armed, SANDBOX.armed = SANDBOX.armed, False  # walking frames reads f_back
        try:
            where = "".join(traceback.format_stack(sys._getframe(1)))
        except ValueError:  # no Python frame below this one
            where = "(no Python frame)\n"
        finally:
            SANDBOX.armed = armed
        value.add_note(f"printed by C code (PyErr_Print) while Python was at:\n{where}")
        harness.printed.append(value)

    sys.unraisablehook = unraisable
    sys.excepthook = excepthook
    sys.addaudithook(SANDBOX.hook)
    # Warm up unarmed: lazy imports happen now, and the seeds' code objects
    # and globals become what the armed sandbox lets through and restores.
    refused = []
    for name, data in seeds.items():
        try:
            harness.run(data)
        except harness.allowed:
            refused.append(name)
    if refused:
        print(f"warning: {len(refused)} seeds do not load: {refused[:5]}", file=sys.stderr)
    # Codecs load lazily (json.loads of UTF-32 bytes imports one): load them
    # now, or a missing codec would be the sandbox's error, not the decoder's.
    for name in ("utf-16", "utf-16-be", "utf-16-le", "utf-32", "utf-32-be", "utf-32-le"):
        codecs.lookup(name)
    gc.collect()
    harness.pristine = Pristine(SANDBOX)
    SANDBOX.freeze()
    print(
        f"tcc-fuzz target={target} seeds={len(seeds)} python={sys.version.split()[0]} "
        f"atheris={importlib.metadata.version('atheris')} keep_going={KEEP_GOING} "
        f"forged_code={FORGED_CODE} findings_dir={FINDINGS}",
        file=sys.stderr,
        flush=True,
    )
    atheris.Setup([argv[0], *rest], harness)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
