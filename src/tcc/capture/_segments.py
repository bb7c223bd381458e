"""Long lists in snapshots, serialised once per segment: O(delta) steps for growing transcripts.

An agent's state usually holds one list that grows by an item at every step: the
transcript.  Pickling it whole at every checkpoint costs O(state) (~2-4 ms at 10,000
messages), although only its end changed.  With a :class:`SegmentCache` (one per run,
kept by the runtime between checkpoints), a list of at least ``MIN_ITEMS`` items is
written as segments (see :func:`layout`): full segments of ``LARGE_SEGMENT`` (2,048)
items from its start, then full ones of ``SEGMENT`` (256), then of ``SMALL_SEGMENT`` (32)
items, each one a separate pickle kept from the previous checkpoint while its items have
not changed, followed by the remaining items (fewer than ``SMALL_SEGMENT``), pickled
normally.  The small segments keep that tail, which every checkpoint pickles again,
short; the large ones keep the number of segments low: every checkpoint walks them, and
the store keeps each out-of-band one as one chunk (a ``tcc._pieces.WholePiece``), with
bookkeeping per chunk at every checkpoint (17 segments at most up to 10,000 items, 45
with segments of 256 and 32 only).  A segment's pickle of at least
``SEGMENT_MIN_BYTES`` goes out of band (``_framed``), a shorter one into the stream.
The list is handed to the cache by the pickler's
``persistent_id`` (``tcc._native.SegmentHook``: one C call per object, which passes on
only long lists; the C pickler gives lists to no other hook), and written as the
persistent id ``("tcc:segments", blobs, tail)``, or ``("tcc:segments", blobs, tail,
holes)`` when segments left items out (below); loading rebuilds one list from it
(:func:`tcc.capture._records.join_segments`), the same list for every reference to it.

A segment is reused only when it stands for exactly what is in the list now, decided
without reading any item's contents (``tcc._native.segment_unchanged``):

* the list holds the same item objects at those positions (the cache keeps them
  alive, so an address cannot be reused by another object);
* each item is immutable -- ``str``, ``bytes``, numbers, ``bool``, ``None``, or
  tuples of those -- or an exact ``dict`` of ``str`` keys and such values that has
  not changed since the segment was recorded;
* nothing but the list (and the cache) holds such a dict: a dict that is also a local,
  or in another list, would be rebuilt as a copy, so the segment leaves it out (a hole,
  below).

How "not changed" and "held by nothing else" are known depends on the interpreter:

* **3.11** reads each dict at every snapshot: its version tag (PEP 509; every change
  gives a dict a new, globally unique one) and its reference count (2: the list and
  the cache).  That touches every item of a long list, one cache miss each.
* **3.12 and later** watch the segment's dicts (``PyDict_Watch``): the first change of
  any of them marks the segment's token, and a snapshot only compares the list's item
  pointers.  Sharing does not show in a watcher, so the pickler's ``persistent_id``
  also reports every watched dict it meets elsewhere in the state (one C test per
  dict), and a dump in which a dict of a reused segment was also pickled outside it is
  done again with that segment dropped (:meth:`Dump.conflicts`); the segment is then
  recorded anew with the dict as a hole (found by its reference count,
  ``segment_shared``).  Holes are not watched: the pickler meets them in the stream.

An item that fails these tests -- a dict also held by a local or another list (a system
prompt kept in a variable), a list, an object -- is a *hole*: its segment pickles ``None``
in its place and the item itself goes into the persistent id's ``holes``, ``(position,
item)`` pairs pickled with the rest of the state at every dump, where the pickler's memo
keeps the sharing; it is only compared by identity when the segment is reused.  (A hole that
leads back to its list makes the pickler meet the list again while it writes the id: later
references to such a list are ``("tcc:list", tail)``, the tail being already memoised.)  A
segment takes at most one hole in ``MAX_HOLES_PER`` items.  A segment whose shared dict is
no longer shared is recorded again without that hole, and a span at the end of the list
with a shared dict (the message just appended, still in a local) waits a step as the tail.
A list the cache does not know (``msgs = msgs + [reply]`` makes one at every step) takes
over the segments of a remembered list that nothing but the cache holds any more and that
started with the same item; such lists are forgotten before each dump
(:meth:`SegmentCache.sweep`: holding them would make their items look shared).  Anything
else -- a list of objects, of lists, of dicts holding lists, a list shorter than
``MIN_ITEMS`` -- is pickled as before.  The one difference a program could see: equal
strings (and other immutable values) in different segments come back as equal objects that
may not be identical (``is``), as after any copy.
"""

from __future__ import annotations

import pickle
import sys
import threading
from typing import Any

from .._pieces import WholePiece
from ._frames import native
from ._framed import MIN_BYTES
from ._records import BUFFER_PID, LIST_REF_PID, NAMESPACE_PID, SEGMENTS_PID

def namespace_pid(obj: Any) -> tuple[str, str] | None:
    """The persistent id of a module's namespace (``globals()`` held by the agent): the
    module's name, so that a restore gives that module's namespace, not a copy.  Not for
    ``__main__`` (in a loading process that is another program) nor a module pickled by
    value: those are copied, as before."""
    if type(obj) is dict and "__spec__" in obj:
        name = obj.get("__name__")
        if type(name) is str and name not in ("__main__", "__mp_main__") and not _by_value(name):
            module = sys.modules.get(name)
            if module is not None and getattr(module, "__dict__", None) is obj:
                return (NAMESPACE_PID, name)
    return None


def _by_value(name: str) -> bool:
    """Whether cloudpickle writes module ``name``'s functions by value (registered with
    ``cloudpickle.register_pickle_by_value``): a loading process need not have it, so
    its namespace is copied, as before."""
    import cloudpickle  # type: ignore[import-untyped]

    registered = getattr(cloudpickle.cloudpickle, "_PICKLE_BY_VALUE_MODULES", ())
    return any(name == m or name.startswith(m + ".") for m in registered)


def namespace_hook() -> Any:
    """A ``persistent_id`` for dumps without segments: module namespaces only (one C call
    per object, as the segments' hook); None without the native module."""
    from ._frames import available

    return native().SegmentHook(namespace_pid, sys.maxsize, 0, False) if available() else None


LARGE_SEGMENT = 2048  # the segments from the start of the list: few pieces for the store
SEGMENT = 256  # the segments after the last full LARGE_SEGMENT
SMALL_SEGMENT = 32  # the segments after the last full SEGMENT: the tail stays short
MIN_ITEMS = 2 * SMALL_SEGMENT
SEGMENT_MIN_BYTES = 8 << 10  # a segment's pickle this long goes out of band; a shorter one
# is copied into the stream (a store handles each out-of-band piece on its own, at every
# checkpoint: many small ones cost more than copying them)
MAX_LISTS = 128  # lists remembered per cache (least recently pickled ones are forgotten)
MAX_HOLES_PER = 8  # a segment may leave out one item in this many (at least one item)
_INELIGIBLE = object()
_NONE = type(None)


def _immutable(value: Any, depth: int = 0) -> bool:
    # identity tests: a set lookup would take a class whose metaclass compares equal to str
    t = type(value)
    if t is str or t is int or t is float or t is bytes or t is bool or t is _NONE or t is complex:
        return True
    return t is tuple and depth < 8 and all(_immutable(v, depth + 1) for v in value)


def _version(item: Any) -> Any:
    """None for an immutable item, a dict's version tag, or ``_INELIGIBLE``."""
    if _immutable(item):
        return None
    if type(item) is dict and all(type(k) is str for k in item) \
            and all(_immutable(v) for v in item.values()):
        return native().dict_version(item)
    return _INELIGIBLE


def layout(n: int) -> list[tuple[int, int]]:
    """The ``(start, size)`` segments a list of ``n`` items is cut into: full segments of
    :data:`LARGE_SEGMENT` items from the start, then full ones of :data:`SEGMENT` items,
    then of :data:`SMALL_SEGMENT` items; the rest (fewer than ``SMALL_SEGMENT`` items) is
    the tail, pickled with the dump.  When the list fills its next ``SEGMENT`` (or
    ``LARGE_SEGMENT``), the smaller segments there give way to one larger one (its items
    pickled once more: one item per step and size, amortised, on a growing list)."""
    if n < MIN_ITEMS:
        return []
    spans: list[tuple[int, int]] = []
    start = 0
    for size in (LARGE_SEGMENT, SEGMENT, SMALL_SEGMENT):
        end = start + (n - start) // size * size
        spans += [(at, size) for at in range(start, end, size)]
        start = end
    return spans


class _Segment:
    __slots__ = ("items", "versions", "blob", "token", "failures", "holes", "shared")

    def __init__(self, items: tuple[Any, ...], versions: tuple[Any, ...], blob: bytes,
                 token: bytearray | None = None, failures: int = 0,
                 holes: tuple[int, ...] = (), shared: tuple[int, ...] = ()) -> None:
        self.items = items
        self.versions = versions  # what segment_unchanged checks: None for a watched dict
        self.blob = blob
        self.token = token  # watched dicts (3.12+): token[0] is set by their first change
        self.failures = failures  # native().watch_failures() when it was recorded
        self.holes = holes  # indices of the items the blob leaves out (None in their place)
        self.shared = shared  # those of them that are dicts left out only for being shared

    def clean(self, failures: int) -> bool:
        """Whether no watched dict of the segment has changed (after the pointer test)."""
        token = self.token
        return token is None or (not token[0] and failures == self.failures)

    def release(self) -> None:
        """Stop watching the segment's dicts (it is being dropped).  The token is marked
        first: a dump still going on that reused the segment can no longer be told of a
        change or a sharing of its dicts, so it must be made again."""
        token = self.token
        if token is not None:
            token[0] = 1
            native().dict_unwatch(self.items, token)  # (only what this token watches)
            self.token = None


_EMPTY = _Segment((), (), b"")


# what SegmentCache._reduce gives for a list it cuts: the segments' pickles, the tail (a new
# list), the tokens of the segments' watched dicts, and the holes as (position, item)
_Reduced = tuple[tuple[bytes, ...], list[Any], list[bytearray], tuple[tuple[int, Any], ...]]


class SegmentCache:
    """The segments of the long lists a run's snapshots hold, from one checkpoint to the
    next.  It keeps those lists and their items alive until it is dropped."""

    def __init__(self) -> None:
        self._lists: dict[int, tuple[list[Any], list[_Segment]]] = {}
        # the segments of lists that only the cache held, from sweep() to settle(), by the
        # id of their first item (which they keep alive): a new list may take them over
        self._orphans: dict[int, list[list[_Segment]]] = {}
        self._kept: list[Any] = []  # what segments dropped during a dump held (_drop)
        self._dumps = 0  # dumps between sweep() and settle() (threads may share a cache)
        self._lock = threading.Lock()
        self.reused = 0  # segments taken from the cache (for tests and benchmarks)
        self.written = 0  # segments pickled anew

    def _record(self, lst: list[Any], start: int, size: int) -> _Segment | None:
        items = tuple(lst[start:start + size])
        if len(items) != size:  # the list shrank meanwhile (another thread)
            return None
        nat = native()
        # The holes: items the segment cannot stand for -- a dict something else also holds
        # (it would come back as a copy), anything that is neither immutable nor a flat dict
        # -- pickled with the rest of the state at every dump instead, a few at most.
        odd = {i for i, item in enumerate(items) if _version(item) is _INELIGIBLE}
        shared = tuple(i for i in nat.segment_shared(lst, start, items) if i not in odd)
        holes = tuple(sorted(odd.union(shared)))
        if len(holes) > max(1, size // MAX_HOLES_PER) or (shared and start + size == len(lst)):
            # too many; or a shared dict at the end of the list, most likely the message
            # just appended and still in a local: the span waits a step, as the tail
            return None
        token: bytearray | None = None
        failures = 0
        watched = tuple(item for i, item in enumerate(items)
                        if type(item) is dict and i not in holes)
        if watched:
            # watched before it is read (3.12+): a change from here on marks the token
            # (watching changes a dict's version tag); not the holes, which the pickler
            # meets in the stream
            token, failures = bytearray(1), nat.watch_failures()
            if not nat.dict_watch(watched, token):  # 3.11, or no watcher slot left
                token = None
        del watched  # (it holds the dicts: the reference counts below must not see it)
        versions = tuple(None if i in holes else _version(item) for i, item in enumerate(items))
        # the test a later checkpoint applies on 3.11, now: nothing but the holes changed
        # kind since they were chosen, and no other dict is held by anything but the list
        # and ``items`` (the holes are only compared by identity)
        if any(v is _INELIGIBLE for v in versions) \
                or not nat.segment_unchanged(lst, start, items, versions):
            if token is not None:
                nat.dict_unwatch(items, token)
            return None
        if token is not None:
            versions = (None,) * len(items)  # later: compare pointers, read the token
        body = list(items)
        for i in holes:
            body[i] = None
        # (a WholePiece: the store keeps it as one chunk, since it never changes)
        segment = _Segment(items, versions, WholePiece(pickle.dumps(body, protocol=5)), token,
                           failures, holes, shared)
        if not segment.clean(failures):  # changed while it was read (another thread)
            segment.release()
            return None
        self.written += 1
        return segment

    def _reduce(self, lst: list[Any]) -> _Reduced | None:
        if len(lst) < MIN_ITEMS:
            return None
        with self._lock:  # one cache may serve dumps on several threads
            return self._reduce_locked(lst)

    def _reduce_locked(self, lst: list[Any]) -> _Reduced | None:
        nat = native()
        entry = self._lists.pop(id(lst), None)
        if entry is not None and entry[0] is not lst:  # another list at a reused address
            self._drop(entry[1])
            entry = None
        segments = entry[1] if entry is not None else self._adopt(lst)
        try:
            end = self._walk(lst, segments, nat)
        except BaseException:
            self._drop(segments)
            raise
        if not segments:  # nothing to keep: a list that cannot be cut takes no place here
            return None
        self._lists[id(lst)] = (lst, segments)  # most recently used last
        while len(self._lists) > MAX_LISTS:
            self._drop(self._lists.pop(next(iter(self._lists)))[1])
        tokens = [s.token for s in segments if s.token is not None]
        holes: list[tuple[int, Any]] = []
        pos = 0
        for seg in segments:
            if seg.holes:
                holes.extend((pos + i, seg.items[i]) for i in seg.holes)
            pos += len(seg.items)
        return tuple(s.blob for s in segments), lst[end:], tokens, tuple(holes)

    def sweep(self) -> None:
        """Before a dump: let go of what only the cache still holds, before anything is
        written and outside the lock, so that finalizers see and change the state as it is
        before the snapshot, never half-way through it:

        * the lists nothing else holds (``msgs = msgs + [reply]`` leaves one behind at
          every step): holding them would also make their items look shared, so that no
          segment of the list that replaced them could be recorded.  The segments of one
          whose first item something else still holds wait, until :meth:`settle`, for a new
          list that starts with that item to take them over (:meth:`_adopt`);
        * the segments of lists now shorter than ``MIN_ITEMS`` (never walked again);
        * each segment holding a hole (an object left out of its pickle) that is no longer
          in the list, nor anywhere else: it is recorded again at this dump.

        A dump that starts while another is going on (threads sharing a cache) sweeps
        nothing."""
        gone: list[Any] = []
        candidates: list[list[_Segment]] = []
        released: list[list[_Segment]] = []
        with self._lock:
            self._dumps += 1
            if self._dumps > 1:
                return
            dead = [key for key, entry in self._lists.items()
                    # held only by the entry (getrefcount counts its own argument too)
                    if sys.getrefcount(entry[0]) == 2]
            short = [key for key, entry in self._lists.items() if len(entry[0]) < MIN_ITEMS]
            for key in dead:
                entry = self._lists.pop(key)
                gone.append(entry[0])
                candidates.append(entry[1])
                del entry
            for key in short:
                if key in self._lists:
                    released.append(self._lists.pop(key)[1])
            for _, segments in self._lists.values():
                released += _stale(segments)
        gone.clear()  # the lists go now, with what only they held
        first: Any = None
        for segments in candidates:
            released += _stale(segments)
            if not segments or segments[0] is _EMPTY:
                released.append(segments)
                continue
            first = segments[0].items[0]
            # held by the segment, ``first`` and getrefcount's argument: no list can start
            # with it any more (a window slid past it)
            if sys.getrefcount(first) <= 3:
                released.append(segments)
                continue
            with self._lock:
                self._orphans.setdefault(id(first), []).append(segments)
        first = None
        candidates.clear()
        for segments in released:
            _release_all(segments)
        released.clear()

    def settle(self) -> None:
        """After a dump: drop the segments no new list took over, and what the segments
        dropped during the dump held (outside the lock: these may go now)."""
        with self._lock:
            self._dumps -= 1
            if self._dumps:
                return  # another dump still goes on: the last one settles
            left = [segments for group in self._orphans.values() for segments in group]
            self._orphans.clear()
            kept, self._kept = self._kept, []
        for segments in left:
            _release_all(segments)
        left.clear()
        kept.clear()

    def _drop(self, segments: list[_Segment]) -> None:
        """Release segments during a dump.  Immutable items and flat dicts (of immutable
        values) go with them, which nothing can see; anything else they held -- the holes
        left out for their kind, a dict changed since to hold an object -- is kept until
        :meth:`settle`, so that no finalizer runs half-way through the dump."""
        for seg in segments:
            seg.release()
            self._kept.extend(item for item in seg.items if _version(item) is _INELIGIBLE)

    def _adopt(self, lst: list[Any]) -> list[_Segment]:
        """The segments a list the cache does not know takes over: those of a list gone since
        :meth:`sweep` whose first segment holds the same items as this list's start (each
        is then checked by ``_walk`` as any other)."""
        if not lst:  # (emptied by another thread since _reduce looked)
            return []
        group = self._orphans.get(id(lst[0]))
        if not group:
            return []
        check = native().segment_unchanged
        for i, segments in enumerate(group):
            head = segments[0]
            if check(lst, 0, head.items, (None,) * len(head.items)):  # (the pointers only)
                del group[i]
                return segments
        return []

    def _walk(self, lst: list[Any], segments: list[_Segment], nat: Any) -> int:
        """Bring ``segments`` (the list's, from the previous dump) up to date with ``lst``:
        reuse each that is unchanged, record the others again, and stop at the first span
        that cannot be recorded.  Returns where the tail (pickled with the dump) starts."""
        check, failures = nat.segment_unchanged, nat.watch_failures()
        n = len(lst)
        spans = layout(n)
        if spans and sum(spans[-1]) == n and type(lst[-1]) is dict \
                and sum(len(seg.items) for seg in segments) < n \
                and nat.segment_shared(lst, n - 1, (lst[-1],)):
            # (a message no segment holds yet: a segment's ``items`` would count as a holder)
            # the message just appended and still in a local would complete a span, which
            # _record refuses to end with it: cut as at the step before, the message in the
            # tail (else, where a larger segment replaces smaller ones, those are dropped
            # and the whole span would be pickled into the stream for a step)
            spans = layout(n - 1) or spans[:-1]
        for k, (start, size) in enumerate(spans):
            if k < len(segments):
                seg = segments[k]
                if seg is _EMPTY:
                    pass  # dropped by sweep(): recorded again below
                elif len(seg.items) != size:
                    # cut differently (the list filled a SEGMENT, or shrank): the segments
                    # from here covered what this span now covers, and hold its dicts
                    self._drop(segments[k:])
                    del segments[k:]
                elif check(lst, start, seg.items, seg.versions) and seg.clean(failures) \
                        and not (seg.shared and _unshared(nat, lst, start, seg)):
                    self.reused += 1
                    continue
                else:
                    # changed: drop it (and this reference to its items, or the dicts among
                    # them would seem held elsewhere while the segment is recorded again)
                    segments[k] = _EMPTY
                    self._drop([seg])
                del seg
            new = self._record(lst, start, size)
            if new is None:
                break
            if k < len(segments):
                segments[k] = new
            else:
                segments.append(new)
        else:
            k = len(spans)
        self._drop(segments[k:])
        del segments[k:]
        return spans[k - 1][0] + spans[k - 1][1] if k else 0

    def close(self) -> None:
        """Forget every list (and stop watching their dicts)."""
        with self._lock:
            for _, segments in self._lists.values():
                _release_all(segments)
            self._lists.clear()
            for group in self._orphans.values():
                for segments in group:
                    _release_all(segments)
            self._orphans.clear()
            self._kept.clear()

    def __del__(self) -> None:
        try:
            for _, segments in self._lists.values():
                _release_all(segments)
        except Exception:  # noqa: BLE001 - interpreter shutdown: nothing left to watch
            pass


def _unshared(nat: Any, lst: list[Any], start: int, seg: _Segment) -> bool:
    """Whether a dict the segment left out for being shared is no longer shared: the segment
    is then recorded again, with it (a hole costs a pickle at every dump)."""
    still = nat.segment_shared(lst, start, seg.items)
    return any(i not in still for i in seg.shared)


def _stale(segments: list[_Segment]) -> list[list[_Segment]]:
    """Replace by ``_EMPTY`` each of ``segments`` holding a hole left out for its kind that
    nothing but the segment holds any more (it left the list); returns them, each in a list
    of its own, for the caller to release."""
    out = []
    for k, seg in enumerate(segments):
        if seg.holes and any(sys.getrefcount(seg.items[i]) <= 2  # (the items, the argument)
                             for i in seg.holes if i not in seg.shared):
            segments[k] = _EMPTY
            out.append([seg])
    return out


def _release_all(segments: list[_Segment]) -> None:
    for seg in segments:
        seg.release()


class Dump:
    """One dump's persistent ids and out-of-band buffers (``_framed``).

    The same id object stands for every reference to a list or value, so that it loads
    as one object (each dump has its own, so dumps sharing a cache do not mix).  The
    segments' pickles of at least ``SEGMENT_MIN_BYTES``, and ``bytes``/``bytearray``
    values and protocol-5 buffers of at least ``MIN_BYTES``, go out of band:
    :attr:`buffers` receives them in stream order; smaller ones stay in the stream."""

    def __init__(self, cache: SegmentCache) -> None:
        self.cache = cache
        self.pids: dict[int, tuple[Any, Any]] = {}  # id -> (object, its pid from now on)
        self.buffers: list[bytes | memoryview] = []
        self._blobs: set[int] = set()  # ids of the segment pickles in this dump's ids
        self._reused: dict[int, bytearray] = {}  # tokens of the segments this dump reused
        self._met: dict[int, bytearray] = {}  # tokens of the watched dicts pickled outside them

    def hook(self) -> Any:
        """The pickler's ``persistent_id`` (not kept here: a cycle would keep this dump's
        lists, and the dicts in them, alive past the dump, until a collection)."""
        return native().SegmentHook(self.pid, MIN_ITEMS, MIN_BYTES, True)

    def conflicts(self) -> bool:
        """Whether a dict of a segment this dump reused was also pickled outside it (so the
        dump would restore it as two objects), or changed, or was taken over by another
        segment, while the dump went on.  Marks those segments changed: the dump must be
        made again, and they are then recorded anew only if nothing else holds them."""
        clash = [t for k, t in self._met.items() if k in self._reused]
        for token in clash:
            token[0] = 1
        return any(t[0] for t in self._reused.values())

    def pid(self, obj: Any) -> Any:
        """The persistent id that stands for ``obj`` in this dump, or None: pickle it as
        usual.  The tail in an id (the items after the last segment, a new list) is never cut
        again."""
        if type(obj) is dict:
            named = namespace_pid(obj)
            if named is not None:
                return named
            token = native().watch_token(obj)  # a dict some segment watches, met in the stream
            if token is not None:
                self._met[id(token)] = token
            return None
        known = self.pids.get(id(obj))
        if known is not None:
            return known[1]
        pid: tuple[Any, ...] | None
        if type(obj) is list:
            reduced = self.cache._reduce(obj)
            if reduced is None:
                pid = None
            else:
                blobs, tail, tokens, holes = reduced
                self._reused.update((id(t), t) for t in tokens)
                self._blobs.update(id(b) for b in blobs)
                pid = (SEGMENTS_PID, tuple(pickle.PickleBuffer(b) for b in blobs), tail)
                self.pids[id(tail)] = (tail, None)
                if holes:  # pickled here, with the rest of the state (join_segments)
                    pid += (holes,)
                    # A hole may lead back to the list through tuples only (the list itself,
                    # a namedtuple holding it): the pickler would then meet ``pid`` again
                    # while it is still writing it, which a tuple cannot refer to.  Later
                    # references name the tail instead, which the pickler has memoised
                    # before the holes, and which loads as the very list being built.
                    self.pids[id(obj)] = (obj, (LIST_REF_PID, tail))
                    return pid
        else:  # bytes or bytearray of at least MIN_BYTES (the hook passes nothing else)
            pid = (BUFFER_PID, type(obj).__name__, pickle.PickleBuffer(obj))
        self.pids[id(obj)] = (obj, pid)  # keeps ``obj`` alive: its id is not reused in this dump
        return pid

    def buffer(self, buf: pickle.PickleBuffer) -> bool:
        """The pickler's ``buffer_callback``: False (out of band) for a segment's pickle of
        at least SEGMENT_MIN_BYTES or another buffer of at least MIN_BYTES, True (in the
        stream) for a smaller one."""
        raw = buf.raw()
        owner = raw.obj
        if raw.nbytes < (SEGMENT_MIN_BYTES if id(owner) in self._blobs else MIN_BYTES):
            return True
        # an exact bytes object is handed on as itself: the store knows it by identity
        if isinstance(owner, bytes) and type(owner) in (bytes, WholePiece) and len(owner) == raw.nbytes:
            self.buffers.append(owner)
        else:
            self.buffers.append(raw)
        return False
