"""``dumps`` / ``loads``: object graphs with live continuations <-> bytes."""

from __future__ import annotations

import contextlib
import io
import pickle
import sys
from typing import TYPE_CHECKING, Any, Iterator

from .. import errors
from . import _blob, _flow, _frames, _framed, _records

if TYPE_CHECKING:
    from ._pickler import Pickler

PROTOCOL = 5

# Each generator frame costs three nested pickle levels (generator, record,
# slots); 200-deep await chains need more than the default limit of 1000.
_RECURSION_FLOOR = 6000


@contextlib.contextmanager
def _deep_recursion() -> Iterator[None]:
    old = sys.getrecursionlimit()
    if old < _RECURSION_FLOOR:
        sys.setrecursionlimit(_RECURSION_FLOOR)
    try:
        yield
    finally:
        if old < _RECURSION_FLOOR:
            sys.setrecursionlimit(old)


def _new_pickler(buf: io.BytesIO, segments: Any = None) -> Pickler:
    # imported at the first pickling, not with tcc: see ``_registry``
    from ._pickler import Pickler

    return Pickler(buf, protocol=PROTOCOL, segments=segments)


# Plain data: what tcc's pickler writes exactly as pickle does (the C pickler handles these
# exact types itself, before any reducer_override or dispatch table is asked; not complex,
# which reducer_override sees, so a reducer registered for it must apply).
ATOMS = frozenset({type(None), bool, int, float, str, bytes})
_PLAIN_ITEMS = 64  # a payload with more items takes tcc's pickler: the walk is not free


def _plain(obj: Any) -> bool:
    """Is ``obj`` small plain data: atoms in exact tuples, lists and dicts (at most
    :data:`_PLAIN_ITEMS` items, no deeper than that)?"""
    todo = [obj]
    seen = 0
    while todo:
        seen += 1
        if seen > _PLAIN_ITEMS:
            return False
        item = todo.pop()
        t = type(item)
        if t in ATOMS:
            continue
        if (t is not tuple and t is not list and t is not dict) or len(item) > _PLAIN_ITEMS:
            return False
        if t is dict:
            todo.extend(item.keys())
            todo.extend(item.values())
        else:
            todo.extend(item)
    return True


def dump_payload(obj: Any) -> bytes:
    """Pickle ``obj`` (uncompressed, no envelope). Raises CaptureError."""
    if _plain(obj):
        # the same bytes tcc's pickler writes, without importing it (cloudpickle and
        # logging: ~10 ms of a `tcc resume` whose first effect takes plain arguments)
        try:
            return pickle.dumps(obj, protocol=PROTOCOL)
        except Exception:  # noqa: BLE001 - e.g. changed by another thread: the pickler's errors
            pass
    payload = _dump(obj, b"")
    assert isinstance(payload, bytes)  # nothing goes out of band without a segment cache
    return payload


def dump_stored(obj: Any, *, segments: Any = None) -> bytes | tuple[bytes | memoryview, ...]:
    """``seal(dump_payload(obj), compress=False, stored=True)`` without copying the pickle
    (the envelope's header is written first, then the pickle after it): the blob the
    runtime hands to a store as a snapshot.  Raises CaptureError.

    ``segments`` (a :class:`SegmentCache` kept between the dumps of one run) lets long
    lists reuse what the previous dump pickled of them (see ``_segments``), and sends
    large buffers out of band (``_framed``): the blob is then returned as the tuple of
    pieces it is the concatenation of -- the envelope, frame and pickle, then each
    buffer -- which a store takes as it is."""
    return _dump(obj, _STORED_HEADER, segments)


_STORED_HEADER = _blob.stored_header()


# A dump that reused a segment whose dict it also met elsewhere is made again (see
# ``_segments.Dump.conflicts``); after this many, once more without segments.
_SEGMENT_ATTEMPTS = 3


def _dump(obj: Any, prefix: bytes, segments: Any = None) -> bytes | tuple[bytes | memoryview, ...]:
    if segments is None:
        return _dump_with(obj, prefix, None)
    try:
        segments.sweep()  # (what only the cache still held goes before anything is written)
        return _dump_with(obj, prefix, segments)
    finally:
        segments.settle()


def _dump_with(obj: Any, prefix: bytes, segments: Any) -> bytes | tuple[bytes | memoryview, ...]:
    attempt = 0
    attach = True
    while attempt <= _SEGMENT_ATTEMPTS:
        buf = io.BytesIO()
        buf.write(prefix)
        cut = segments if attempt < _SEGMENT_ATTEMPTS else None
        try:
            with _deep_recursion():
                pickler = _new_pickler(buf, cut)
                pickler.attach_dicts = attach
                pickler.dump(obj)
        except Exception as exc:  # noqa: BLE001 - every failure becomes a CaptureError
            if cut is not None and (isinstance(exc, RecursionError)  # (cloudpickle wraps it)
                                    or isinstance(exc.__cause__, RecursionError)):
                # a structure segments cannot write (no known case): once more without them
                attempt = _SEGMENT_ATTEMPTS
                continue
            if attach and pickler.attached_dicts:
                # a dict view or iterator brought its dict, which cannot be captured (a
                # module-level dict of clients looped over): once more with views and
                # iterators as copies of what they hold (keys, or what is left to yield)
                attach = False
                continue
            from . import _diagnose

            with _deep_recursion():
                message = _diagnose.explain(obj, exc, _new_pickler)
            raise errors.CaptureError(message) from exc
        dump = pickler.segment_dump
        if dump is None or not dump.conflicts():
            break
        attempt += 1
    buffers = pickler.out_of_band
    if not buffers:
        return buf.getvalue()
    stream = buf.getbuffer()[len(prefix):]
    first = b"".join((prefix, _framed.head([memoryview(b).nbytes for b in buffers]), stream))
    del stream
    return (first, *buffers)


def _check_record(gen: Any, record: Any) -> tuple[tuple[Any, ...], str, str]:
    """Validate one queued record; return native arguments, name, qualname."""
    if not isinstance(gen, _frames.GENERATOR_TYPES):
        raise errors.CorruptSnapshotError(
            f"frame record attached to a {type(gen).__name__}, not a generator"
        )
    code = _frames.code_of(gen)
    where = f"{code.co_qualname}() ({code.co_filename}:{code.co_firstlineno})"
    if not (isinstance(record, tuple) and len(record) == 7 and record[0] == 1):
        raise errors.CorruptSnapshotError(f"malformed frame record for {where}")
    _version, state, offset, slots, exc, name, qualname = record
    if not (isinstance(name, str) and isinstance(qualname, str)):
        raise errors.CorruptSnapshotError(f"malformed frame record for {where}: bad name")
    try:
        # (the cell slots an inlined comprehension cleared at this point, from the analysis)
        shadowed = _flow.shadowed_cells(code, offset, len(slots)) \
            if state == _frames.SUSPENDED and isinstance(slots, tuple) else None
        args = (gen, code, state, offset, slots, exc, _records.NULL, shadowed)
        _frames.native().check_frame(*args)
        # The native check bounds the stack; the flow analysis pins its exact
        # depth and where a NULL may legally sit, so that no record -- however
        # it was made -- can make the interpreter read a NULL it trusts.
        _flow.check_record_shape(code, offset, slots, _records.NULL)
    except (TypeError, ValueError, OverflowError) as exc_:
        raise errors.CorruptSnapshotError(f"invalid frame record for {where}: {exc_}") from None
    return args, name, qualname


def check_frame_record(gen: Any, record: Any) -> None:
    """What a restore checks of one frame record before writing it (the native validator
    and the flow analysis); CorruptSnapshotError naming what is wrong.  Writes nothing."""
    _check_record(gen, record)


def _write_frames(pending: list[tuple[Any, Any]]) -> None:
    if not pending:
        return
    checked = [_check_record(gen, record) for gen, record in pending]
    filled: set[int] = set()
    for (gen, *_rest), name, _qualname in checked:
        if id(gen) in filled:  # found by fuzzing: the second write would fail half-way
            code = _frames.code_of(gen)
            raise errors.CorruptSnapshotError(
                f"two frame records for one generator of {code.co_qualname}() "
                f"({code.co_filename}:{code.co_firstlineno}); nothing was restored")
        filled.add(id(gen))
    # Every record is valid: only now is any frame written.
    native = _frames.native()
    for args, name, qualname in checked:
        native.write_frame(*args)
        gen = args[0]
        if gen.__name__ != name:
            gen.__name__ = name
        if gen.__qualname__ != qualname:
            gen.__qualname__ = qualname


def _discard_fresh(keep: list[tuple[Any, tuple[Any, ...]]]) -> None:
    """Close fresh generators that were made but not filled from a record.

    That happens when loading fails, and when pickle itself throws away a
    reduction of a recursive object.  An unfilled coroutine would otherwise
    warn "never awaited" when collected; closing an unstarted generator runs
    no user code.
    """
    if not _frames.available():
        return
    native = _frames.native()
    filled = {id(gen) for gen, _record in keep}
    for gen in _records.LOAD.fresh:
        if id(gen) not in filled and native.read_frame(gen, _records.NULL)[0] == _frames.CREATED:
            gen.close()


class _Loader(pickle.Unpickler):
    """The unpickler of snapshots: pickle's own, plus the lists written as segments and
    the values written out of band."""

    def __init__(self, file: Any, buffers: Any = None) -> None:
        super().__init__(file, buffers=buffers)
        self._lists = _records.PersistentLists()

    def persistent_load(self, pid: Any) -> Any:
        return self._lists(pid)

    def find_class(self, module: str, name: str) -> Any:
        try:
            if not _records.resolving() and not module.startswith(_records.PINNED_PREFIX):
                return super().find_class(module, name)
            obj: Any = _records.import_module(module)  # pinned code: the resolver's module
            for part in name.split("."):
                obj = getattr(obj, part)
            return obj
        except (ImportError, AttributeError) as exc:
            raise errors.IncompatibleSnapshotError(
                f"snapshot refers to {module}.{name}, which cannot be found here: {exc}") from exc
        except errors.TccError:
            raise
        except Exception as exc:  # noqa: BLE001 - the module's import itself raised
            raise errors.IncompatibleSnapshotError(
                f"snapshot refers to {module}.{name}, and importing module {module} raised "
                f"{type(exc).__name__}: {exc}") from exc


def load_payload(payload: bytes, *, edit: Any = None, modules: Any = None,
                 upgrade: Any = None) -> Any:
    """Unpickle a payload made by :func:`dump_payload` and resume its frames.

    ``modules(name)``, if given, is the module that a module name in the snapshot
    stands for (None: the module imported by that name); the runtime passes it to
    load a run on its pinned code.  ``upgrade(gen, func, fingerprint)``, if given, is
    told of each generator whose function's code differs from the snapshot's, made for
    the new code, instead of refusing it; ``edit`` must then map its record.

    ``edit(obj, records)``, if given, may change the frame records (a list of
    ``(generator, record)`` pairs) before they are validated and written;
    ``tcc fork --set`` uses it to change a local of a suspended frame.
    """
    saved = (_records.LOAD.pending, _records.LOAD.fresh, _records.LOAD.modules,
             _records.LOAD.upgrade)
    (_records.LOAD.pending, _records.LOAD.fresh, _records.LOAD.modules,
     _records.LOAD.upgrade) = [], [], modules, upgrade
    try:
        try:
            if _framed.is_framed(payload):
                stream, buffers = _framed.unframe(payload)
                obj = _Loader(io.BytesIO(stream), buffers).load()
            else:
                obj = _Loader(io.BytesIO(payload)).load()
        except errors.TccError:
            raise
        except ImportError as exc:
            raise errors.IncompatibleSnapshotError(
                f"snapshot refers to something that cannot be found here: {exc}"
            ) from exc
        except (pickle.UnpicklingError, EOFError, MemoryError) as exc:  # damage
            raise errors.CorruptSnapshotError(
                f"snapshot does not unpickle: {type(exc).__name__}: {exc}"
            ) from exc
        except Exception as exc:  # noqa: BLE001 - raised by a class's own code while it was rebuilt
            raise errors.CorruptSnapshotError(
                f"snapshot could not be rebuilt: {type(exc).__name__}: {exc}, raised while it was "
                "loaded by the code of a class in it (its __hash__, __eq__, __setstate__, "
                "__getattr__ or __new__). Most often an object that is a dict key or set member "
                "and also reachable from its own attributes (a reference cycle): pickling "
                "rebuilds it before its attributes are set. Keep such objects in a list, or key "
                "the dict by a plain value (obj.name)"
            ) from exc
        if edit is not None:
            edit(obj, _records.LOAD.pending)
        _write_frames(_records.LOAD.pending)
    except BaseException:
        _discard_fresh([])
        raise
    else:
        _discard_fresh(_records.LOAD.pending)
    finally:
        (_records.LOAD.pending, _records.LOAD.fresh, _records.LOAD.modules,
         _records.LOAD.upgrade) = saved
    return obj


def dumps(obj: Any, *, level: int = 3) -> bytes:
    """Capture ``obj``, including every suspended generator/coroutine in it.

    Returns a self-describing blob (header, integrity digest, zstandard
    payload). Raises :class:`tcc.CaptureError` naming the frame and variable
    that hold anything that cannot be captured.
    """
    return _blob.seal(dump_payload(obj), level=level)


def loads(data: bytes | bytearray | memoryview) -> Any:
    """Rebuild what :func:`dumps` captured; continuations resume where they were.

    Every call gives new, independent objects.  Raises
    :class:`tcc.RestoreError` (corrupt or incompatible snapshot, changed code)
    before any frame is written.
    """
    return load_payload(_blob.unseal(data))
