"""Types of ``tcc._native`` (native/tcc_native.c): read and write suspended frames.

Every function validates its arguments against the frame before touching it and raises
on any mismatch; none writes frame memory it has not validated.
"""

from typing import Any

CREATED: int
SUSPENDED: int
RUNNING: int
FINISHED: int
KIND_ITER: int
KIND_EXC: int
KIND_EXC_OR_NONE: int
KIND_LASTI: int
KIND_LIST: int
KIND_SET: int
KIND_DICT: int
KIND_TUPLE: int
KIND_EXC_ITEMS: int
BUILT_FOR: str  # the exact CPython version this module was compiled for

def view_offset(view: memoryview, exporter: Any, /) -> int | None:
    """The byte offset of ``view``'s memory in ``exporter``'s simple buffer, or None."""

def read_frame(gen: Any, null: object, /) -> tuple[int, int, tuple[Any, ...], BaseException | None, Any]:
    """(state, offset, slots, exc, func) of a generator's or coroutine's frame, undisturbed."""

def check_frame(gen: Any, code: Any, state: int, offset: int, slots: tuple[Any, ...],
                exc: BaseException | None, null: object, shadowed: bytes | None = None, /) -> None:
    """Validate a frame record against a fresh generator; write nothing."""

def check_kinds(slots: tuple[Any, ...], kinds: Any, null: object, lasti_max: int, /) -> int:
    """Index of the first slot that lacks a kind it needs (``KIND_*`` flags), or -1."""

def write_frame(gen: Any, code: Any, state: int, offset: int, slots: tuple[Any, ...],
                exc: BaseException | None, null: object, shadowed: bytes | None = None, /) -> None:
    """Validate a frame record, then write it into a fresh generator."""

def dict_version(d: dict[Any, Any], /) -> int:
    """The version tag of an exact dict (PEP 509): new on every change."""

def segment_unchanged(lst: list[Any], start: int, items: tuple[Any, ...],
                      versions: tuple[int | None, ...], /) -> bool:
    """Whether ``lst[start:start+len(items)]`` holds exactly ``items``, each dict among them
    still at its recorded version and held by nothing but the list and ``items``."""

def segment_shared(lst: list[Any], start: int, items: tuple[Any, ...], /) -> tuple[int, ...]:
    """The indices of the exact dicts among ``items`` that something besides ``lst`` and
    ``items`` also holds, or that ``lst`` does not hold at ``start + i``."""

def dict_watch(items: tuple[Any, ...], token: bytearray, /) -> bool:
    """Watch each exact dict among ``items`` (3.12+): any change sets ``token[0]``.  False
    (nothing watched) where the interpreter has no dict watchers."""

def dict_unwatch(items: tuple[Any, ...], token: Any, /) -> None:
    """Stop watching the dicts among ``items`` that ``token`` watches."""

def watch_token(d: Any, /) -> bytearray | None:
    """The token of the segment watching dict ``d``, if any."""

def watch_failures() -> int:
    """How many dict changes could not be told to their segment (out of memory)."""

class SegmentHook:
    """A pickler's ``persistent_id`` that costs one C call per object: None, unless the
    object is an exact list of at least ``min_items`` items, (``min_bytes`` > 0) an exact
    ``bytes`` or ``bytearray`` of at least ``min_bytes`` bytes, or (``watched_dicts``) an
    exact dict a segment watches, which go to ``callback``."""

    def __init__(self, callback: Any, min_items: int, min_bytes: int = 0,
                 watched_dicts: bool = False) -> None: ...
    def __call__(self, obj: Any, /) -> Any: ...
