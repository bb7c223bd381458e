"""tcc: transparent continuation checkpointing for async Python.

Capture the live chain of suspended coroutine and generator frames of an
ordinary ``async def`` program, store it, and resume it -- in another
process, after a crash -- at the exact instruction where it stopped.
"""

from ._start import resume as resume
from ._start import start as start
from ._version import __version__ as __version__
from .capture import dumps as dumps
from .capture import loads as loads
from .capture import register_reducer as register_reducer
from .effects import approval as approval
from .effects import checkpoint as checkpoint
from .effects import current as current
from .effects import effect as effect
from .effects import env as env
from .effects import gather as gather
from .effects import resource as resource
from .effects import sleep as sleep
from .effects import sleep_until as sleep_until
from .effects import spawn as spawn
from .effects import wait_for as wait_for
from .errors import CaptureError as CaptureError
from .errors import CodeChangedError as CodeChangedError
from .errors import CorruptSnapshotError as CorruptSnapshotError
from .errors import IncompatibleSnapshotError as IncompatibleSnapshotError
from .errors import RestoreError as RestoreError
from .errors import TccError as TccError

__all__ = [
    "CaptureError",
    "CodeChangedError",
    "CorruptSnapshotError",
    "IncompatibleSnapshotError",
    "RestoreError",
    "TccError",
    "__version__",
    "approval",
    "checkpoint",
    "current",
    "dumps",
    "effect",
    "env",
    "gather",
    "loads",
    "register_reducer",
    "resource",
    "resume",
    "sleep",
    "sleep_until",
    "spawn",
    "start",
    "wait_for",
]
