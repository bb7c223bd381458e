"""The whole tcc exception tree, and nothing else.

Every error tcc raises on purpose derives from :class:`TccError`, and each also
derives from the builtin exception that best describes it, so callers who do
not know tcc can still catch it sensibly (a :class:`CaptureError` is a
``TypeError`` like any other "cannot pickle" failure).
"""

from __future__ import annotations

__all__ = [
    "TccError",
    "CaptureError",
    "RestoreError",
    "CorruptSnapshotError",
    "IncompatibleSnapshotError",
    "CodeChangedError",
    "StoreError",
    "StoreNotFoundError",
    "StoreConnectionError",
    "StoreCorruptError",
    "StoreFullError",
    "StoreInsecureError",
    "FencedError",
    "RunNotFoundError",
    "ReplayDivergenceError",
    "UnawaitedEffectError",
    "InternalError",
    "UsageError",
    "ScriptImportError",
    "RunFailedError",
]


class TccError(Exception):
    """Base class of every error raised by tcc on purpose."""


# --------------------------------------------------------------------- capture


class CaptureError(TccError, TypeError):
    """An object graph could not be turned into a snapshot.

    The message names the frame (function, file:line) and the path from that
    frame's variable to the object that could not be captured.
    """


# --------------------------------------------------------------------- restore


class RestoreError(TccError, ValueError):
    """A snapshot could not be turned back into live objects."""


class CorruptSnapshotError(RestoreError):
    """The snapshot bytes are damaged: bad header, checksum or structure."""


class IncompatibleSnapshotError(RestoreError):
    """The snapshot is intact but was made by another interpreter or format."""


class CodeChangedError(IncompatibleSnapshotError):
    """A function's code differs from the code the snapshot was taken with."""


# ----------------------------------------------------------------------- store


class StoreError(TccError, OSError):
    """A problem with the durable store; the message names the store path."""


class StoreNotFoundError(StoreError, FileNotFoundError):
    """No store exists at the given path."""


class StoreCorruptError(StoreError):
    """A stored record failed verification or the store files are foreign."""


class StoreFullError(StoreError):
    """The disk or the store's map is full; nothing committed was lost."""


class StoreInsecureError(StoreError, PermissionError):
    """The store's directory or files could be changed by another user; tcc will not use them."""


class StoreConnectionError(StoreError, ConnectionError):
    """The store's database server could not be reached, or the connection was lost.

    Raised by a store that lives on a server (PostgreSQL).  If the connection
    broke during a write, the message says so: whether that write committed is
    then unknown, and the run resumes from what the store has.
    """


class FencedError(StoreError):
    """This writer's epoch is stale: another process owns the run now."""


class RunNotFoundError(StoreError, LookupError):
    """No run with that id exists (for this tenant)."""


# --------------------------------------------------------------------- runtime


class ReplayDivergenceError(TccError, RuntimeError):
    """Replayed code asked for a different effect than the journal holds."""


class UnawaitedEffectError(TccError, RuntimeError):
    """Inside a run, an effect call (or tcc.sleep, tcc.wait_for ...) was never awaited."""


class UsageError(TccError, ValueError):
    """A command names something that does not exist or cannot be done (exit 2)."""


class ScriptImportError(TccError, ImportError):
    """The agent script raised while it was being imported (a missing module, a syntax error)."""


class RunFailedError(TccError, RuntimeError):
    """The run stopped with status ``failed``; the message says why."""


class InternalError(TccError, RuntimeError):
    """A bug in tcc itself. Please report it with the message."""
