"""Move one run, with its spawned children, from one store to another as one file.

``tcc export RUN -o FILE`` reads the run through the public :class:`~tcc.store.Store`
interface (run record, events, journal, retained snapshots, signals, the code it
recorded) together with every child it spawned, and writes one file;
``tcc import FILE [--run-id NEW]`` writes the same runs into any store, LMDB or
PostgreSQL.  One implementation serves every pair of backends.

**The key.**  A *transfer key* (32 random bytes as 64 hex digits, in a file of this
user with mode 0600, like a store key file) encrypts and authenticates the file:
``--transfer-key PATH`` or ``$TCC_TRANSFER_KEY_FILE``; ``tcc export`` creates the
file if it does not exist.  It is its own key, not a store's: an LMDB store's secret
never leaves the store's directory and a PostgreSQL store's key opens the whole
database, so neither may be handed to the other side, and two stores that share no
key must still be able to exchange a run.  Whoever imports needs the same key file
(copy it over a channel you trust, once; any number of files can use it).

**Why authenticated.**  Snapshots are pickles that a store authenticates before it
returns them, and resuming unpickles them: whoever could make ``tcc import`` accept
bytes of their own could run code as whoever resumes the imported run.  So the whole
file is checked before anything is written to the target store: a file that is not an
export, that was made with another key, that is truncated or has any byte changed is
refused with an error naming which, and the store is left untouched.

**Why encrypted.**  A run holds what an encrypted store encrypts (arguments, results,
effect answers, the agent's locals): the file never holds them in plaintext.
AES-256-GCM (the ``cryptography`` package: ``pip install 'tcc[encryption]'``) under a
key derived from the transfer key, with a random nonce per file; the header is the
associated data.

**File layout** (integers big-endian)::

    magic     8 bytes   b"TCCRUNX1"
    version   u16       FORMAT_VERSION
    key id    8 bytes   keyed BLAKE2b of nothing under the transfer key: tells a file
                        made with another key from a damaged one
    nonce     12 bytes
    length    u64       bytes of ciphertext that follow (GCM tag included)
    body      AES-256-GCM(zstandard(u32 doc length | doc JSON | blobs))

The document is JSON; every opaque payload (arguments, results, errors, journal
values, snapshots, signal values, code) is a blob, referenced by its index.

**What the runs become.**  Each run is created anew with the target store's own
epoch, times and snapshot numbers; its events are copied (the source's ``created``
event is the target's own), the journal is appended record by record with the same
sequence numbers, and each retained snapshot is checkpointed where its ``journal_len``
says, so a resume continues from the newest snapshot and is served the journal after
it.  A run that was ``running`` when its owner died stays ``running`` with no live
owner, so ``tcc resume`` (or a worker) takes it up as a crashed run: a call whose intent
has no completion is in doubt there, exactly as in the source.  The claims the source
recorded (``taken_over``/``reclaimed``) are renumbered below the target's first claim
(``new_epoch`` 1; the source's in ``source_new_epoch``) so that they still count as
earlier executions.  An ``imported`` event records the source run id, store, tenant
and times; an ``exported`` event on each source run records the export.  Export copies:
the source runs stay as they are (cancel them there if only the copy should continue,
or the source's worker resumes them too).

**Children** keep their ids, which the parent's journal and snapshots imply (a child's
id is ``PARENT.k``, derived from the parent's id and call number).  With ``--run-id
NEW`` the whole tree is renamed consistently (``PARENT.k`` becomes ``NEW.k``) and the
idempotency keys in the journal with it (``PARENT:k`` becomes ``NEW:k``: a resumed
run serves journaled calls by key).  A call that was issued but has no completion
(in doubt, or a child still running under a parked parent), or a failed run (``tcc
retry`` re-issues the failed call with its key), would then be issued again under a
key the outside world never saw, so such a tree is refused for renaming: import it
under its own ids.

**Consistency.**  A run whose owner is alive and executing it (status ``running``
with a live lease) is refused: export it once it parks, finishes or its owner is
gone (SIGTERM parks a ``tcc run``).  Reads are repeated if a run changed while it was
read (a worker woke it), and refused if it keeps changing.

**Atomicity of an import.**  Each store call commits on its own, so the runs are
written one call at a time; if one fails (the id was taken meanwhile, the store
filled up), the runs already created are deleted (``delete_run``: their events remain
as an audit trail, with a ``deleted`` event) and the error says so.  Code sources are
content-addressed and shared by the tenant's runs: they stay.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import secrets
import struct
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import Any

import zstandard

from .. import _version, errors
from ..store import (HOST, PARKED_STATUSES, Completion, JournalRecord, RunInfo, Store, check_name,
                     read_secret_file, redact_url, write_key_file)
from ._markers import SLEEP_EFFECT, WAIT_EFFECT
from ._pinning import CODE_EVENT
from ._views import owner_alive

__all__ = ["TRANSFER_KEY_ENV", "Exported", "Imported", "export_run", "import_run", "make_transfer_key",
           "read_transfer_key"]

TRANSFER_KEY_ENV = "TCC_TRANSFER_KEY_FILE"
MAGIC = b"TCCRUNX1"
FORMAT = "tcc-run-export"
FORMAT_VERSION = 1
_HEADER = struct.Struct(">8sH8s12sQ")
_TAG = 16
_READS = 5  # tries at reading a run that keeps changing meanwhile
_CLAIMS = ("taken_over", "reclaimed")


# ----------------------------------------------------------------------------- the key

def read_transfer_key(path: str | os.PathLike[str]) -> bytes:
    """The 32-byte transfer key in ``path``: 64 hex digits in a regular file of this user,
    closed to group and others (the rules of a store key file)."""
    where = os.fspath(path)
    data = read_secret_file(where, f"the transfer key file {where}", unreadable=errors.UsageError)
    text = data.decode("ascii", "replace").strip()
    if len(text) != 64:
        raise errors.UsageError(f"the transfer key file {where} must hold 64 hex digits, "
                                f"not {len(text)} characters")
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise errors.UsageError(f"the transfer key file {where} must hold 64 hex digits (0-9 a-f), "
                                "and it does not") from None


def make_transfer_key(path: str | os.PathLike[str]) -> bool:
    """Create ``path`` with a new random transfer key (mode 0600) unless it exists; True if
    created.  Written in full under a temporary name, then linked into place (which fails
    if the name exists), so no reader ever sees a half-written key."""
    return write_key_file(os.fspath(path), f"the transfer key file {os.fspath(path)}",
                          error=errors.UsageError, make_folder=True)


def key_id(key: bytes) -> str:
    """A 64-bit fingerprint of a transfer key, safe to show and to store in the file."""
    return _key_id(key).hex()


def _key_id(key: bytes) -> bytes:
    return hashlib.blake2b(b"", key=key, digest_size=8, person=b"tcc-export-id").digest()


def _cipher(key: bytes) -> Any:
    if len(key) != 32:
        raise errors.UsageError(f"a transfer key is 32 bytes, not {len(key)}")
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError:
        raise errors.UsageError(
            "tcc export/import encrypt the file, which needs the 'cryptography' package: "
            "pip install 'tcc[encryption]'") from None
    return AESGCM(hashlib.blake2b(b"", key=key, digest_size=32, person=b"tcc-export-enc").digest())


# ------------------------------------------------------------------------ the container

class _Blobs:
    """Opaque payloads of the document, referenced by index."""

    def __init__(self) -> None:
        self.items: list[bytes] = []

    def put(self, blob: bytes | None) -> int | None:
        if blob is None:
            return None
        self.items.append(bytes(blob))
        return len(self.items) - 1


def _seal(doc: dict[str, Any], blobs: list[bytes], key: bytes) -> bytes:
    doc = {**doc, "blobs": [len(b) for b in blobs]}
    text = json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()
    plain = zstandard.ZstdCompressor(level=3).compress(b"".join([struct.pack(">I", len(text)), text, *blobs]))
    nonce = secrets.token_bytes(12)
    header = _HEADER.pack(MAGIC, FORMAT_VERSION, _key_id(key), nonce, len(plain) + _TAG)
    sealed: bytes = _cipher(key).encrypt(nonce, plain, header)
    return header + sealed


def _open_file(data: bytes, key: bytes, where: str) -> tuple[dict[str, Any], list[bytes]]:
    """The document and blobs of an export file, or StoreCorruptError naming what is wrong;
    nothing of the file is interpreted before every byte of it was authenticated."""
    if 0 < len(data) < len(MAGIC) and MAGIC.startswith(data):
        raise errors.StoreCorruptError(f"{where} is truncated: {len(data)} bytes is shorter than "
                                       "an export's header; nothing was imported")
    if len(data) < len(MAGIC) or data[:len(MAGIC)] != MAGIC:
        raise errors.StoreCorruptError(f"{where} is not a tcc run export (it does not start with an export's "
                                       "header); nothing was imported")
    if len(data) < _HEADER.size:
        raise errors.StoreCorruptError(f"{where} is truncated: {len(data)} bytes is shorter than "
                                       "an export's header")
    _magic, version, kid, nonce, length = _HEADER.unpack_from(data)
    if version != FORMAT_VERSION:
        raise errors.StoreCorruptError(
            f"{where} is a tcc run export of format {version}; this tcc reads format "
            f"{FORMAT_VERSION} (import it with the tcc that made it, or a newer one)")
    if kid != _key_id(key):
        raise errors.StoreCorruptError(
            f"{where} was made with another transfer key (key id {kid.hex()}; the key given has "
            f"key id {key_id(key)}), or its header is damaged; nothing was imported")
    body = memoryview(data)[_HEADER.size:]
    if len(body) != length:
        what = "truncated" if len(body) < length else "longer than it says"
        raise errors.StoreCorruptError(
            f"{where} is damaged: {what} ({len(body)} bytes of body, its header says {length}); "
            "nothing was imported")
    from cryptography.exceptions import InvalidTag

    try:
        plain = _cipher(key).decrypt(nonce, bytes(body), bytes(data[:_HEADER.size]))
    except InvalidTag:
        raise errors.StoreCorruptError(
            f"{where} is damaged: it fails authentication with its key (a byte was changed); "
            "nothing was imported") from None
    try:  # authenticated: what follows is what this tcc wrote, unless it has a bug
        raw = zstandard.ZstdDecompressor().decompress(plain)
        (size,) = struct.unpack_from(">I", raw)
        doc = json.loads(raw[4:4 + size])
        blobs, at = [], 4 + size
        for n in doc["blobs"]:
            blobs.append(raw[at:at + n])
            at += n
        if at != len(raw) or doc.get("format") != FORMAT:
            raise ValueError("its sizes do not add up")
    except (ValueError, KeyError, TypeError, struct.error, zstandard.ZstdError) as exc:
        raise errors.InternalError(f"{where} is authenticated but cannot be read ({exc}); "
                                   "please report it") from None
    return doc, blobs


# ------------------------------------------------------------------------------ export

@dataclasses.dataclass(frozen=True)
class Exported:
    """What :func:`export_run` wrote."""

    run_id: str
    path: str
    runs: tuple[str, ...]
    snapshots: int
    journal: int
    size: int
    key_id: str


def _tree(store: Store, run_id: str) -> list[RunInfo]:
    """``run_id`` and every run it spawned, recursively, parents first."""
    out: list[RunInfo] = []
    todo, seen = [run_id], set()
    while todo:
        rid = todo.pop(0)
        if rid in seen:
            continue
        seen.add(rid)
        try:
            out.append(store.get_run(rid))
        except errors.RunNotFoundError:
            if rid == run_id:
                raise
            continue  # a child deleted since: the parent starts it again if it needs it
        for event in store.events(rid):
            child = dict(event.data).get("child") if event.kind == "spawned" else None
            if isinstance(child, str):
                todo.append(child)
    return out


def _state(store: Store, run: RunInfo) -> tuple[Any, ...]:
    """What changes when a run is written to: read before and after a run is exported."""
    now = store.get_run(run.run_id)
    return (now.status, now.epoch, now.updated, store.journal_length(run.run_id),
            tuple(s.number for s in store.snapshots(run.run_id)), tuple(store.pending_signals(run.run_id)))


def _check_exportable(run: RunInfo) -> None:
    if run.status == "running" and owner_alive(run):
        raise errors.UsageError(
            f"run {run.run_id} is running: its owner (pid {run.owner_pid} on {run.owner_host}) is "
            "alive and holds its lease, so what it writes next would be missing from the file; "
            "export it once it parks or finishes, or once its owner is gone (SIGTERM makes a "
            "`tcc run` park)")


def _read_run(store: Store, run: RunInfo, blobs: _Blobs, digests: set[str]) -> dict[str, Any]:
    rid = run.run_id
    events = store.events(rid)
    journal = store.journal(rid)
    snapshots, damaged = [], []
    for info in store.snapshots(rid):
        try:
            payload = store.load_snapshot(rid, info.number) if not info.damaged else None
        except errors.StoreCorruptError:
            payload = None
        if payload is None:
            damaged.append(info.number)
            continue
        snapshots.append({"number": info.number, "journal_len": info.journal_len,
                          "created": info.created, "payload": blobs.put(payload)})
    # signals: each delivered one is pending, or named by a wait the run reached
    names = set(store.pending_signals(rid))
    for event in events:
        wait_id = dict(event.data).get("id") if event.kind in ("wait", "wait_satisfied", "parked") else None
        if isinstance(wait_id, str):
            names.add(wait_id)
    signals = []
    for name in sorted(names):
        state = store.signal_state(rid, name)
        if state == "pending":
            signals.append({"name": name, "state": state, "value": blobs.put(store.peek_signal(rid, name))})
        elif state == "consumed":
            signals.append({"name": name, "state": state, "value": None})
    for event in events:
        modules = dict(event.data).get("modules") if event.kind == CODE_EVENT else None
        if isinstance(modules, dict):
            digests.update(e["sha256"] for e in modules.values()
                           if isinstance(e, dict) and isinstance(e.get("sha256"), str))
    return {
        "run_id": rid, "entry": run.entry, "args": blobs.put(run.args), "strategy": run.strategy,
        "status": run.status, "created": run.created, "updated": run.updated, "epoch": run.epoch,
        "owner_host": run.owner_host, "owner_pid": run.owner_pid,
        "result": blobs.put(run.result), "error": blobs.put(run.error),
        "parent": list(run.parent) if run.parent is not None else None,
        "events": [{"kind": e.kind, "time": e.time, "data": dict(e.data)} for e in events],
        "journal": [_record(r, blobs) for r in journal],
        "snapshots": snapshots, "damaged_snapshots": damaged, "signals": signals,
    }


def _record(r: JournalRecord, blobs: _Blobs) -> dict[str, Any]:
    return {"seq": r.seq, "kind": r.kind, "time": r.time, "name": r.name, "args": blobs.put(r.args),
            "idempotency_key": r.idempotency_key, "attempt": r.attempt, "intent_seq": r.intent_seq,
            "result": blobs.put(r.result), "error": blobs.put(r.error), "duration": r.duration}


def export_run(store: Store, run_id: str, path: str | os.PathLike[str], *, key: bytes) -> Exported:
    """Write run ``run_id`` and the runs it spawned to ``path`` (mode 0600, replaced
    atomically), encrypted and authenticated with the transfer ``key`` (32 bytes).

    UsageError if a run of the tree is executing under a live owner, or keeps changing
    while it is read.  Records an ``exported`` event on each run written."""
    _cipher(key)  # a bad key, or no `cryptography`, before anything is read
    where = os.path.abspath(os.fspath(path))
    for _ in range(_READS):
        runs = _tree(store, run_id)
        for run in runs:
            _check_exportable(run)
        before = [_state(store, run) for run in runs]
        blobs, digests = _Blobs(), set[str]()
        records = [_read_run(store, run, blobs, digests) for run in runs]
        if [_state(store, run) for run in runs] == before and [r.run_id for r in _tree(store, run_id)] \
                == [r.run_id for r in runs]:
            break
    else:
        raise errors.UsageError(
            f"run {run_id} (or a run it spawned) kept changing while it was read; export it once "
            "it parks or finishes")
    code = {}
    for digest in sorted(digests):
        try:
            code[digest] = blobs.put(store.get_code(digest))
        except errors.StoreCorruptError:
            raise
        except errors.StoreError:
            continue  # not stored (older tcc): --code pinned says so on the other side too
    exported_at = time.time()
    doc = {
        "format": FORMAT, "root": run_id, "runs": records, "code": code,
        "source": {"store": redact_url(store.path), "tenant": store.tenant, "host": HOST,
                   "time": exported_at, "tcc": _version.__version__},
    }
    data = _seal(doc, blobs.items, key)
    _write_private(where, data)
    names = tuple(r["run_id"] for r in records)
    for record in records:
        store.add_event(record["run_id"], "exported", {
            "file": where, "root": run_id, "runs": len(names), "key_id": key_id(key),
            "snapshots": [s["number"] for s in record["snapshots"]],
            "journal": len(record["journal"])})
    return Exported(run_id, where, names, sum(len(r["snapshots"]) for r in records),
                    sum(len(r["journal"]) for r in records), len(data), key_id(key))


def _write_private(where: str, data: bytes) -> None:
    """``data`` into ``where`` (mode 0600), all or nothing: a temporary file renamed into place."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=".tcc-export-", dir=os.path.dirname(where))
    except OSError as exc:
        raise errors.UsageError(f"cannot write {where}: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, where)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise errors.UsageError(f"cannot write {where}: {exc.strerror}") from None
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


# ------------------------------------------------------------------------------ import

@dataclasses.dataclass(frozen=True)
class Imported:
    """What :func:`import_run` created: ``runs`` maps each source run id to its new id."""

    run_id: str
    source_run_id: str
    runs: Mapping[str, str]
    status: str


def _renames(doc: dict[str, Any], run_id: str | None) -> dict[str, str]:
    """Source run id -> target run id for every run in the file."""
    root = doc["root"]
    ids = [r["run_id"] for r in doc["runs"]]
    if run_id is None or run_id == root:
        return {rid: rid for rid in ids}
    check_name("run id", run_id, new=True)
    for record in doc["runs"]:
        rid = record["run_id"]
        if rid != root and not rid.startswith(root + "."):
            raise errors.UsageError(
                f"run {root}'s child {rid} is not named after it, so it cannot be renamed with "
                "it; import without --run-id")
        if record["status"] == "failed":
            raise errors.UsageError(
                f"run {rid} failed, and `tcc retry` issues its failed call again under the "
                "call's idempotency key, which --run-id would change; import it without --run-id")
        open_calls = _open_intents(record["journal"])
        if open_calls:
            raise errors.UsageError(
                f"run {rid} has a call in flight ({', '.join(open_calls)}: issued, no outcome "
                "recorded); a resume issues it again with its idempotency key, which --run-id "
                "would change, so the outside world could see it twice; import it without "
                "--run-id")
    return {rid: run_id + rid[len(root):] for rid in ids}


def _open_intents(journal: list[dict[str, Any]]) -> list[str]:
    """The calls in flight (issued, no outcome) that the outside world may have seen: a
    wait or a sleep the run is parked at is not one (nothing outside the run sees its key)."""
    done = {r["intent_seq"] for r in journal if r["kind"] == "completion"}
    latest: dict[str, dict[str, Any]] = {}
    for r in journal:
        if r["kind"] == "intent":
            latest[r["idempotency_key"] or f"seq:{r['seq']}"] = r
    return [f"{r['name']} ({key})" for key, r in latest.items()
            if r["seq"] not in done and r["name"] not in (WAIT_EFFECT, SLEEP_EFFECT)]


def _rename_key(key: str | None, renames: Mapping[str, str]) -> str | None:
    """``RUN:k`` -> ``NEW:k`` (the call keys of a renamed run)."""
    if key is None:
        return None
    rid, sep, n = key.rpartition(":")
    return f"{renames[rid]}:{n}" if sep and rid in renames else key


def _event_data(kind: str, data: dict[str, Any], renames: Mapping[str, str]) -> dict[str, Any]:
    out = dict(data)
    for name in ("child", "parent"):  # spawned, parked, started: the tree's ids
        if isinstance(out.get(name), str) and out[name] in renames:
            out[name] = renames[out[name]]
    if kind == "retried" and isinstance(out.get("key"), str):
        out["key"] = _rename_key(out["key"], renames)
    if kind in _CLAIMS and isinstance(out.get("new_epoch"), int):
        # every claim the source recorded came before any claim of the target (epoch 2 on)
        out["source_new_epoch"] = out["new_epoch"]
        out["new_epoch"] = 1
    return out


def import_run(store: Store, path: str | os.PathLike[str], *, key: bytes,
               run_id: str | None = None) -> Imported:
    """Create the runs of the export file ``path`` in ``store``, under their own ids, or
    with the root renamed ``run_id`` (its children renamed with it).

    The whole file is authenticated with the transfer ``key`` first: a damaged or foreign
    file raises StoreCorruptError and writes nothing.  UsageError if a run id exists in
    the store.  If writing fails midway, the runs already created are deleted."""
    where = os.fspath(path)
    try:
        with open(where, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise errors.UsageError(f"cannot read {where}: {exc.strerror}") from None
    doc, blobs = _open_file(data, key, where)
    renames = _renames(doc, run_id)
    leftovers = []
    for old, new in renames.items():
        try:
            there = store.get_run(new)
        except errors.RunNotFoundError:
            continue
        if there.status == "importing":  # an import of it that was interrupted: replaced
            leftovers.append(new)
            continue
        hint = "import it under another id with --run-id NEW" if old == doc["root"] else \
            f"run {doc['root']}'s child {new} is in the way: import under another --run-id"
        raise errors.UsageError(f"run {new} exists in this store already; {hint} (nothing was imported)")
    for rid in leftovers:
        store.delete_run(rid)
    code = {digest: blobs[i] for digest, i in doc["code"].items()}
    if code:  # content-addressed and shared by the tenant's runs: not undone on failure
        store.put_code(code)
    created: list[str] = []
    try:
        # every run is written in status `importing` (nothing resumes it), and given its
        # own status only once all are written, children first: a process killed
        # meanwhile leaves runs no worker takes up (importing the file again replaces them)
        finishers = [_write_run(store, record, blobs, renames, doc["source"], created)
                     for record in doc["runs"]]
        for finish in reversed(finishers):
            finish()
    except BaseException as exc:
        left = []
        for rid in reversed(created):
            try:
                store.delete_run(rid)
            except Exception:  # noqa: BLE001 - said in the error, not raised over it
                left.append(rid)
        if not isinstance(exc, errors.TccError) or not created:
            raise
        done = (f"; the runs it had created ({', '.join(created)}) were deleted again" if not left else
                f"; the runs {', '.join(left)} it had created could not be deleted: they stay "
                "in status `importing`, which nothing resumes; import the file again (that "
                "replaces them), or `tcc cancel` them")
        raise type(exc)(f"import of {where} failed: {exc}{done}") from exc
    root = renames[doc["root"]]
    return Imported(root, doc["root"], dict(renames), store.get_run(root).status)


def _write_run(store: Store, record: dict[str, Any], blobs: list[bytes], renames: Mapping[str, str],
               source: dict[str, Any], created: list[str]) -> Callable[[], None]:
    """Write one run in status ``importing``; return what gives it its own status."""
    def blob(i: int | None) -> bytes | None:
        return None if i is None else blobs[i]

    new_id = renames[record["run_id"]]
    # a spawned child wakes its parent when it finishes (a fleet store's due-work mark)
    parent = next((e["data"].get("parent") for e in record["events"] if e["kind"] == "started"
                   and isinstance(e["data"], dict)), None)
    spawned_by = renames.get(parent) if isinstance(parent, str) else None
    # the target store writes its own `created` event, with what the source's said more
    # (a submitted run's options)
    first = record["events"][0] if record["events"] and record["events"][0]["kind"] == "created" else None
    info = {k: v for k, v in (first["data"] if first and isinstance(first["data"], dict) else {}).items()
            if k not in ("entry", "epoch", "status")}
    run = store.create_run(record["entry"], blob(record["args"]) or b"", strategy=record["strategy"],
                           run_id=new_id, status="importing", spawned_by=spawned_by, info=info)
    created.append(new_id)
    epoch = run.epoch
    for event in record["events"][1 if first else 0:]:
        store.add_event(new_id, event["kind"], _event_data(event["kind"], event["data"], renames))
    # the journal, record by record, with each snapshot where its journal_len says
    snapshots = sorted(record["snapshots"], key=lambda s: s["number"])
    numbers: list[list[int]] = []

    def checkpoint_up_to(length: int) -> None:
        while snapshots and snapshots[0]["journal_len"] <= length:
            snap = snapshots.pop(0)
            info = store.checkpoint(new_id, epoch, blobs[snap["payload"]])
            numbers.append([snap["number"], info.number])

    for n, r in enumerate(record["journal"]):
        checkpoint_up_to(n)
        if r["kind"] == "intent":
            seq = store.append_intent(new_id, epoch, r["name"], blob(r["args"]) or b"",
                                      idempotency_key=_rename_key(r["idempotency_key"], renames),
                                      attempt=r["attempt"])
        else:
            seq = store.append_completion(new_id, epoch, Completion(
                r["intent_seq"], result=blob(r["result"]), error=blob(r["error"]),
                duration=r["duration"] or 0.0))
        if seq != r["seq"]:
            raise errors.InternalError(f"run {new_id}: journal record {r['seq']} was written as "
                                       f"{seq}; please report it")
    checkpoint_up_to(len(record["journal"]))
    for signal in record["signals"]:  # (the pending ones once the run has its status)
        if signal["state"] == "consumed":
            store.send_signal(new_id, signal["name"], blob(signal["value"]) or b"")
            store.take_signal(new_id, epoch, signal["name"])
    store.add_event(new_id, "imported", {
        "run": record["run_id"], "store": source["store"], "tenant": source["tenant"],
        "host": source["host"], "exported": source["time"], "created": record["created"],
        "updated": record["updated"], "epoch": record["epoch"], "status": record["status"],
        "snapshots": numbers, **({"damaged_snapshots": record["damaged_snapshots"]}
                                 if record["damaged_snapshots"] else {})})
    status = record["status"]
    # a sleep's end, a wait's deadline: when a fleet store's worker takes the run up again
    parked = next((e["data"] for e in reversed(record["events"])
                   if e["kind"] == "parked" and isinstance(e["data"], dict)), {})
    until = parked.get("until" if status == "sleeping" else "deadline")
    wake = float(until) if status in PARKED_STATUSES and isinstance(until, (int, float)) else None

    def finish() -> None:
        if status == "cancelled":
            store.cancel_run(new_id, reason=f"cancelled in {source['store']} before the export")
            return
        # anyone may take the run up once it has its status: its owner, this process, leaves it
        store.renew_lease(new_id, epoch, 0.0)
        store.set_status(new_id, epoch, status, result=blob(record["result"]),
                         error=blob(record["error"]), wake=wake)
        for signal in record["signals"]:  # a waiting run's signal marks it due
            if signal["state"] != "consumed":
                store.send_signal(new_id, signal["name"], blob(signal["value"]) or b"")

    return finish
