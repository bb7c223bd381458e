"""Pinned code: a run records the source of its own modules, and ``tcc resume --code
pinned`` continues it on that source after the files changed or were deleted.

**What is recorded.**  At each snapshot, the source of every loaded module of the
project: the run's script, and each module whose file lies under the project root
(the script's folder, or ``$TCC_PROJECT_ROOT``), never one under ``site-packages``
or ``dist-packages``, and never tcc itself.  Sources are stored once per content
(``Store.put_code``, keyed by SHA-256), and an event ``code`` maps module names to
digests, written with the snapshot it belongs to (a deferred event: the manifest is
never newer or older than the snapshot beside it).  The check is one ``len(sys.modules)``
per snapshot; a module is read and hashed once per process.

A module whose file changed after this process imported it cannot be recorded (what
is on disk is not what runs): its functions are compiled from the file and compared
with the loaded ones, and a mismatch is recorded as ``stale`` instead.  Files older
than the process need no such check.

**Pinned modules.**  When the recorded code differs from the files, every recorded
module is loaded from its recorded source under its own name,
``__tcc_pinned_<digest16>_<name>``, so the current modules are untouched and both can
live in one process.  A pinned module's imports of other recorded modules (``import
m``, ``from m import x``, relative imports) get their pinned versions; anything else
(libraries, the standard library) is imported as usual.  Its code objects carry the
file name ``<pinned FILE DIGEST8>``, whose lines tracebacks show from the recorded
source.  Snapshots taken afterwards name the pinned modules, so the run stays on its
pinned code until it finishes, whatever later resumes ask.
"""

from __future__ import annotations

import builtins
import functools
import hashlib
import importlib
import importlib.util
import linecache
import os
import sys
import threading
import time
import types
from collections.abc import Mapping
from typing import Any

from .. import errors
from ..capture import PINNED_PREFIX, fingerprint
from ..store import Store
from . import _scripts
from ._globals import _in_site_packages, _real_path

__all__ = ["CODE_EVENT", "CODE_MODES", "CODE_POLICIES", "DEFAULT_POLICY", "awaiting_decision", "policy_of", "CodeRecorder", "PinnedCode", "manifest_of", "project_root"]

CODE_EVENT = "code"
CODE_MODES = ("current", "pinned", "upgrade")  # what ``tcc resume --code`` accepts
#: What ``tcc resume`` (and the worker) does when a run's recorded code differs from the
#: files (``tcc run --on-code-change``): continue on the recorded code, refuse, or move
#: the run onto the new code first (``tcc upgrade``).
CODE_POLICIES = ("pinned", "refuse", "upgrade")
DEFAULT_POLICY = "pinned"
ROOT_ENV = "TCC_PROJECT_ROOT"

# Manifest: module name -> {"file": path, "sha256": digest} (+ "from": the original
# name, for a pinned module), the newest entry of each name in the run's code events.
Manifest = dict[str, dict[str, str]]


def pinned_name(name: str, digest: str) -> str:
    return f"{PINNED_PREFIX}{digest[:16]}_{name}"


def original_name(module: types.ModuleType) -> str:
    """The name a (pinned) module had in the project."""
    return str(getattr(module, "__tcc_pinned_from__", None) or module.__name__)


def project_root(entry: str) -> str:
    """Where the run's own modules live: ``$TCC_PROJECT_ROOT``, else the script's folder,
    else (a module entry ``pkg.mod:f``) the folder that holds its top-level package."""
    configured = os.environ.get(ROOT_ENV)
    if configured:
        return os.path.realpath(configured)
    if not _scripts.is_module_entry(entry):
        return os.path.dirname(os.path.realpath(_scripts.split_entry(entry)[0]))
    name = entry.rpartition(":")[0]
    module = sys.modules.get(name)
    file = getattr(module, "__file__", None)
    if not isinstance(file, str):
        return os.path.realpath(os.getcwd())
    folder = os.path.dirname(os.path.realpath(file))
    for _ in range(name.count(".") + (1 if file.endswith("__init__.py") else 0)):
        folder = os.path.dirname(folder)
    return folder


def manifest_of(events: Any) -> Manifest:
    """The run's code manifest from its events (newest entry of each module wins)."""
    manifest: Manifest = {}
    for event in events:
        if event.kind != CODE_EVENT:
            continue
        if event.data.get("reset"):  # an upgrade: the complete code the run runs from here
            manifest = {}
        modules = event.data.get("modules")
        if not isinstance(modules, dict):
            continue
        for name, entry in modules.items():
            if isinstance(name, str) and isinstance(entry, dict) \
                    and isinstance(entry.get("sha256"), str) and isinstance(entry.get("file"), str):
                manifest.pop(name, None)  # keys in the order recorded last: newest last
                manifest[name] = {k: v for k, v in entry.items() if isinstance(v, str)}
        for name in event.data.get("stale") or {}:
            if isinstance(name, str):
                manifest.pop(name, None)  # its last recorded source is not what ran
    return manifest


def awaiting_decision(events: Any) -> list[str]:
    """The changed modules of a run whose ``refuse`` policy makes it wait for a person (its
    recorded files differ from the current ones), or ``[]``: the same answer for `tcc
    resume`, the worker and `tcc ls`.  A run already on its recorded code (a fork taken on
    it, a `--code pinned` resume) has had its decision and stays on that code."""
    if policy_of(events) != "refuse":
        return []
    manifest = manifest_of(events)
    if not manifest or any(name.startswith(PINNED_PREFIX) for name in manifest):
        return []
    return changed_files(manifest)


def policy_of(events: Any) -> str:
    """The run's ``--on-code-change`` policy, from its ``started`` event (a submitted run's
    ``created``)."""
    for event in events:
        if event.kind in ("started", "forked", "created") and "on_code_change" in event.data:
            policy = event.data.get("on_code_change")
            return policy if policy in CODE_POLICIES else DEFAULT_POLICY
    return DEFAULT_POLICY


def changed_files(manifest: Manifest) -> list[str]:
    """The recorded (not pinned) modules whose file is gone or differs from its source."""
    out = []
    for name, entry in manifest.items():
        if name.startswith(PINNED_PREFIX):
            continue
        try:
            with open(entry["file"], "rb") as f:
                same = hashlib.sha256(f.read()).hexdigest() == entry["sha256"]
        except OSError:
            same = False
        if not same:
            out.append(name)
    return sorted(out)


def _process_start() -> float:
    """When this process started (wall clock), or when tcc was imported if unknown."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            ticks = int(f.read().rpartition(")")[2].split()[19])
        with open("/proc/stat", encoding="ascii") as f:
            btime = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        return btime + ticks / os.sysconf("SC_CLK_TCK") - 2.0  # btime has 1 s resolution
    except (OSError, ValueError, IndexError, StopIteration):
        return _IMPORTED - 2.0


_IMPORTED = time.time()
_STARTED: float | None = None


@functools.lru_cache(maxsize=1)
def _interpreter_dirs() -> tuple[str, ...]:
    """Where the interpreter's own modules live (never the project's, even when a project
    root contains them: a conda or pixi environment, a root of /)."""
    import sysconfig

    dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    paths = sysconfig.get_paths()
    dirs.update(paths.get(k, "") for k in ("stdlib", "platstdlib", "purelib", "platlib"))
    return tuple(sorted({os.path.realpath(d).rstrip(os.sep) + os.sep for d in dirs if d}))


def _outside_project(name: str, real: str) -> bool:
    return _in_site_packages(real) or real.startswith(_interpreter_dirs()) \
        or name.partition(".")[0] in getattr(sys, "stdlib_module_names", ())


def compiled_codes(source: bytes, file: str) -> list[types.CodeType]:
    """Every code object ``source`` compiles to (the module's and all nested ones); none if
    it does not compile."""
    try:
        work = [compile(source, file, "exec", dont_inherit=True)]
    except (SyntaxError, ValueError):
        return []
    out = []
    while work:
        code = work.pop()
        out.append(code)
        work.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    return out


def fingerprints_by_name(source: bytes, file: str) -> dict[str, set[bytes]]:
    """``{qualname: fingerprints}`` of the code ``source`` compiles to."""
    out: dict[str, set[bytes]] = {}
    for code in compiled_codes(source, file):
        out.setdefault(code.co_qualname, set()).add(fingerprint(code))
    return out


def _loaded_functions(module: types.ModuleType, file: str) -> list[types.FunctionType]:
    """The functions and methods ``module`` holds that were compiled from ``file`` (not
    those a decorator generated, such as a dataclass's ``__init__``)."""
    out = []
    name = module.__name__
    candidates: list[Any] = []
    for value in list(vars(module).values()):
        if isinstance(value, types.FunctionType):
            candidates.append(value)
        elif isinstance(value, type) and value.__module__ == name:
            candidates.extend(vars(value).values())
    for value in candidates:
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        if isinstance(value, types.FunctionType) and value.__module__ == name \
                and value.__code__.co_filename == file:
            out.append(value)
    return out


def _matches(module: types.ModuleType, source: bytes, file: str) -> bool:
    """Whether ``source`` compiles to the functions ``module`` holds."""
    compiled = fingerprints_by_name(source, file)
    if not compiled:
        return False
    return all(fingerprint(func.__code__) in compiled.get(func.__code__.co_qualname, ())
               for func in _loaded_functions(module, file))


class CodeRecorder:
    """Records a run's module sources with its snapshots (one per driver)."""

    def __init__(self, store: Store, run_id: str, epoch: int, root: str,
                 known: Mapping[str, Mapping[str, str]]) -> None:
        self.store, self.run_id, self.epoch = store, run_id, epoch
        self.root = root.rstrip(os.sep) + os.sep
        self.known = {name: entry.get("sha256") for name, entry in known.items()}
        # names the run continues on pinned versions of: a current module of that name
        # loaded here (by a library, importlib) is not the run's code, and is not recorded
        self.pinned_from = {entry["from"] for entry in known.values() if entry.get("from")}
        # whether this run runs on pinned code in this process: otherwise a pinned module
        # loaded here is not its code (an upgrade's first leg loaded it; the run has left it)
        self.record_pinned = False
        self._seen = 0
        self._judged: dict[str, types.ModuleType] = {}
        self._stored: set[str] = set()

    def record(self, *, deferred: bool = True) -> None:
        """Before a snapshot: store the sources of project modules loaded since the last
        look, and queue the manifest entries that changed (written with the snapshot).
        ``deferred=False`` (a run's start): write them at once, so that a run killed
        before its first snapshot is resumed on the code it started with too."""
        if len(sys.modules) == self._seen:
            return
        self._seen = len(sys.modules)
        entries: dict[str, dict[str, str]] = {}
        sources: dict[str, bytes] = {}
        stale: dict[str, str] = {}
        for name, module in list(sys.modules.items()):
            if not isinstance(module, types.ModuleType) or self._judged.get(name) is module:
                continue
            self._judged[name] = module
            if name in self.pinned_from or (name.startswith(PINNED_PREFIX) and not self.record_pinned):
                continue
            found = self._source_of(name, module)
            if found is None:
                continue
            file, digest, source = found
            if digest is None:
                stale[name] = file
                continue
            if self.known.get(name) == digest:
                continue
            entry = {"file": file, "sha256": digest}
            if name.startswith(PINNED_PREFIX):
                entry["from"] = original_name(module)
            entries[name] = entry
            if source is not None and digest not in self._stored:
                sources[digest] = source
        if not entries and not stale:
            return
        if sources:
            self.store.put_code(sources)
            self._stored.update(sources)
        for name, entry in entries.items():
            self.known[name] = entry["sha256"]
        data: dict[str, Any] = {"root": self.root.rstrip(os.sep), "modules": entries}
        if stale:
            data["stale"] = stale
        self.store.add_event(self.run_id, CODE_EVENT, data, epoch=self.epoch, deferred=deferred)

    def _source_of(self, name: str, module: types.ModuleType) -> tuple[str, str | None, bytes | None] | None:
        """(file, digest, source) of a project module (digest None: the file changed
        since it was imported; source None: already stored), or None if not one."""
        pinned = getattr(module, "__tcc_pinned__", None)
        file = getattr(module, "__file__", None)
        if isinstance(pinned, str) and isinstance(file, str):
            return file, pinned, None
        if name == "__main__" or name == "tcc" or name.startswith("tcc.") \
                or not isinstance(file, str) or not file.endswith(".py"):
            return None
        real = _real_path(file)
        if not real.startswith(self.root) or _outside_project(name, real):
            return None
        # the path as imported, not resolved: a release switched by a symbolic link
        # (current -> releases/2) is a change of the file at that path
        path = os.path.abspath(file)
        try:
            with open(path, "rb") as f:
                source = f.read()
                changed = os.fstat(f.fileno()).st_mtime >= _started()
        except OSError:
            return path, None, None
        if changed and not _matches(module, source, file):
            return path, None, None
        return path, hashlib.sha256(source).hexdigest(), source

    def reset(self, manifest: Manifest) -> None:
        """After an upgrade: record the complete code the run runs from now on, in one
        ``reset`` event: every loaded project module, and every module of ``manifest``
        (the old code) whose file still exists, as its file is now; no pinned ones."""
        entries: dict[str, dict[str, str]] = {}
        sources: dict[str, bytes] = {}
        for name, entry in manifest.items():
            original = entry.get("from", name)
            if original in entries or name.startswith(PINNED_PREFIX) and original in manifest:
                continue
            try:
                with open(entry["file"], "rb") as f:
                    source = f.read()
            except OSError:
                continue  # gone: the new code does not have it
            digest = hashlib.sha256(source).hexdigest()
            entries[original] = {"file": entry["file"], "sha256": digest}
            sources[digest] = source
        for name, module in list(sys.modules.items()):
            if isinstance(module, types.ModuleType) and not name.startswith(PINNED_PREFIX):
                found = self._source_of(name, module)
                if found is not None and found[1] is not None:
                    entries[name] = {"file": found[0], "sha256": found[1]}
                    if found[2] is not None:
                        sources[found[1]] = found[2]
        if sources:
            self.store.put_code(sources)
        self.known = {name: entry["sha256"] for name, entry in entries.items()}
        self.pinned_from = set()
        self._seen = len(sys.modules)
        self.store.add_event(self.run_id, CODE_EVENT, {"root": self.root.rstrip(os.sep), "reset": True,
                                                       "modules": entries},
                             epoch=self.epoch, deferred=True)


def _started() -> float:
    global _STARTED
    if _STARTED is None:
        _STARTED = _process_start()
    return _STARTED


class PinnedCode:
    """Resolves the module names of a run's snapshots to its pinned modules.

    ``pin``: load every recorded module from its recorded source if any of them
    differs from its file (``--code pinned``); otherwise only names that are pinned
    already (a run that continued on pinned code before) resolve to pinned modules.
    """

    _lock = threading.RLock()

    def __init__(self, store: Store, run_id: str, manifest: Manifest | None, *,
                 pin: bool) -> None:
        self.store, self.run_id = store, run_id
        self._manifest = manifest
        self.remap: dict[str, str] = {}  # original name -> pinned name
        self.changed: list[str] = []
        if pin:
            self.changed = changed_files(self.manifest)
            if self.changed:
                self.remap = {name: pinned_name(name, entry["sha256"])
                              for name, entry in self.manifest.items()
                              if not name.startswith(PINNED_PREFIX)}

    @property
    def manifest(self) -> Manifest:
        if self._manifest is None:
            self._manifest = manifest_of(self.store.events(self.run_id))
        return self._manifest

    # ------------------------------------------------------------- resolving

    def _pinned_of(self, name: str) -> str | None:
        """The pinned module that stands for project module ``name``: its remap
        (``--code pinned``), else the pinned version of it the run recorded last, if the
        run recorded that after ``name`` itself (the run continues on pinned code)."""
        if name in self.remap:
            return self.remap[name]
        newest = None
        for recorded, entry in self.manifest.items():  # oldest first
            if recorded == name:
                newest = None
            elif entry.get("from") == name:
                newest = recorded
        return newest

    def names(self) -> set[str]:
        """The names of the project modules this run runs pinned versions of."""
        return set(self.remap) | {entry["from"] for entry in self.manifest.values() if entry.get("from")}

    @property
    def active(self) -> bool:
        """Whether any module of this run resolves to pinned code."""
        return bool(self.remap) or any(n.startswith(PINNED_PREFIX) for n in self.manifest)

    def resolve(self, name: str) -> types.ModuleType | None:
        """The pinned module a snapshot's module name stands for, or None (import it)."""
        if name in self.remap:
            return self._load(self.remap[name])
        if name.startswith(PINNED_PREFIX):
            return self._load(name)
        pinned = self._pinned_of(name) if self._manifest is not None or self.remap else None
        return self._load(pinned) if pinned is not None else None  # the run is on pinned code

    def entry_module(self, entry: str) -> types.ModuleType:
        """The module of the run's entry: pinned if the run's code is, else the current."""
        name = entry.rpartition(":")[0] if _scripts.is_module_entry(entry) \
            else _scripts.module_name(_scripts.split_entry(entry)[0])
        pinned = self._pinned_of(name)
        if pinned is None:
            return _scripts.entry_module(entry)
        if not _scripts.is_module_entry(entry):  # as a script loaded from its file: a module
            folder = os.path.dirname(_scripts.split_entry(entry)[0])  # (as load_script puts it)
            if folder not in sys.path:  # the run had not imported yet is found beside it
                sys.path.insert(0, folder)
        return self._load(pinned)

    def _where(self, pname: str) -> tuple[str, str, str]:
        """(original name, file, digest) of pinned module ``pname``."""
        for name, entry in self.manifest.items():
            if name == pname:
                return entry.get("from", name), entry["file"], entry["sha256"]
            if pinned_name(name, entry["sha256"]) == pname:
                return name, entry["file"], entry["sha256"]
        raise errors.IncompatibleSnapshotError(
            f"the snapshot of run {self.run_id} names pinned module {pname}, which the run's "
            "recorded code does not hold")

    def _load(self, pname: str) -> types.ModuleType:
        with self._lock:
            module = sys.modules.get(pname)
            if module is not None:
                return module
            orig, file, digest = self._where(pname)
            try:
                source = self.store.get_code(digest)
            except errors.StoreError as exc:
                raise errors.IncompatibleSnapshotError(
                    f"run {self.run_id}: the recorded source of module "
                    f"{_scripts.script_display_name(orig)} ({file}) cannot be read: {exc}") from None
            label = f"<pinned {os.path.basename(file)} {digest[:8]}>"
            text = source.decode("utf-8", "replace")
            linecache.cache[label] = (len(text), None, text.splitlines(True), label)
            module = types.ModuleType(pname)
            is_package = os.path.basename(file) == "__init__.py"
            module.__file__ = file
            module.__package__ = orig if is_package else orig.rpartition(".")[0]
            if is_package:  # a submodule the run never loaded comes from the current files
                module.__path__ = [os.path.dirname(file)]
            module.__dict__["__tcc_pinned__"] = digest
            module.__dict__["__tcc_pinned_from__"] = orig
            module.__dict__["__builtins__"] = dict(vars(builtins), __import__=self._importer(module))
            sys.modules[pname] = module
            try:
                exec(compile(source, label, "exec", dont_inherit=True), module.__dict__)  # noqa: S102
            except BaseException as exc:
                del sys.modules[pname]
                raise errors.RestoreError(
                    f"run {self.run_id}: the recorded source of module "
                    f"{_scripts.script_display_name(orig)} ({file}) failed to import: "
                    f"{type(exc).__name__}: {exc}") from exc
            return module

    def _importer(self, module: types.ModuleType) -> Any:
        """``__import__`` for a pinned module: recorded modules come pinned."""
        real_import = builtins.__import__
        package = module.__package__ or ""

        def _import(name: str, globals: Any = None, locals: Any = None,  # noqa: A002
                    fromlist: Any = (), level: int = 0) -> Any:
            absname = importlib.util.resolve_name("." * level + name, package) if level else name
            parts = absname.split(".")
            pinned = {p: self._pinned_of(p) for p in (".".join(parts[:i]) for i in range(1, len(parts) + 1))}
            if not any(pinned.values()):
                return real_import(absname, globals, locals, fromlist, 0)
            chain: list[types.ModuleType] = []
            for i in range(1, len(parts) + 1):
                prefix = ".".join(parts[:i])
                pname = pinned[prefix]
                mod = self._load(pname) if pname else importlib.import_module(prefix)
                if chain and getattr(chain[-1], "__tcc_pinned__", None):
                    setattr(chain[-1], parts[i - 1], mod)
                chain.append(mod)
            target = chain[-1]
            if fromlist:
                for item in fromlist:
                    if item == "*" or not getattr(target, "__tcc_pinned__", None):
                        continue
                    sub = self._pinned_of(f"{absname}.{item}")
                    if sub is not None:
                        setattr(target, item, self._load(sub))
                    elif not hasattr(target, item) and hasattr(target, "__path__"):
                        try:  # a submodule the run never loaded: the current file's
                            setattr(target, item, importlib.import_module(f"{absname}.{item}"))
                        except ModuleNotFoundError:
                            pass  # `from pkg import name`: the usual ImportError follows
                return target
            return chain[0]

        return _import
