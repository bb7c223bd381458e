"""The runtime: drive a run, checkpoint after effects, recover after a crash.

What a front end (the CLI, a library user, a dashboard) does to runs is here, once:
:func:`run` (start, or resume by id), :func:`resume`, :func:`retry`, :func:`signal`,
:func:`answer`, :func:`cancel`, :func:`fork`, :func:`run_detail`, :func:`snapshot_state`,
:func:`start_resume` (a resume in a process of its own), and the :class:`Worker`.  The rest
is what they are built from.
"""

import typing as _typing

from ._operations import Cancellation as Cancellation
from ._operations import HYBRID_EVERY as HYBRID_EVERY
from ._operations import answer as answer
from ._operations import cancel as cancel
from ._operations import default_snapshot_every as default_snapshot_every
from ._operations import run as run
from ._operations import signal as signal
from ._pinning import CODE_POLICIES as CODE_POLICIES
from ._runs import STRATEGIES as STRATEGIES
from ._runs import resume as resume
from ._pinning import awaiting_decision as awaiting_decision
from ._runs import check_retry as check_retry
from ._runs import retry as retry
from ._runs import reusable_run as reusable_run
from ._runs import send_signal as send_signal
from ._runs import start as start
from ._runs import submit as submit
from ._worker import Worker as Worker
from ._worker import pending_waits as pending_waits
from ._worker import start_resume as start_resume
from ._driver import Driver as Driver
from ._driver import Outcome as Outcome
from ._attempts import Intent as Intent
from ._journal import ResumeWarning as ResumeWarning
from ._parking import STOP as STOP
from ._state import Resumption as Resumption
from ._state import RunState as RunState
from ._state import STATE_TAG as STATE_TAG
from ._state import unpack_state as unpack_state
from ._outcome import decode_error as decode_error
from ._outcome import decode_result as decode_result
from ._outcome import error_line as error_line
from ._outcome import traceback_lines as traceback_lines
from ._markers import MARKERS as MARKERS
from ._markers import SLEEP_EFFECT as SLEEP_EFFECT
from ._markers import SPAWN_EFFECT as SPAWN_EFFECT
from ._markers import WAIT_EFFECT as WAIT_EFFECT
from ._scripts import SCRIPT_PREFIX as SCRIPT_PREFIX
from ._scripts import describe_entry as describe_entry
from ._scripts import entry_of as entry_of
from ._scripts import is_module_entry as is_module_entry
from ._scripts import load_script as load_script
from ._scripts import script_display_name as script_display_name
from ._scripts import module_name as script_module_name
from ._scripts import split_entry as split_entry
from ._agent_errors import forgotten_await as forgotten_await
from ._agent_errors import unsupported_await as unsupported_await
from ._trace import flush_tracing as flush_tracing

if _typing.TYPE_CHECKING:
    from ._views import RunDetail as RunDetail
    from ._views import SnapshotView as SnapshotView
    from ._views import code_state as code_state
    from ._views import run_detail as run_detail
    from ._views import snapshot_state as snapshot_state
    from ._views import owner_alive as owner_alive
    from ._views import when as when
    from ._fork import fork as fork
    from ._sync import GreenletTask as GreenletTask
    from ._upgrade import Plan as UpgradePlan
    from ._upgrade import upgrade as upgrade
    from ._transfer import TRANSFER_KEY_ENV as TRANSFER_KEY_ENV
    from ._transfer import Exported as Exported
    from ._transfer import Imported as Imported
    from ._transfer import export_run as export_run
    from ._transfer import import_run as import_run
    from ._transfer import make_transfer_key as make_transfer_key
    from ._transfer import read_transfer_key as read_transfer_key

__all__ = [
    "Cancellation",
    "Driver",
    "Exported",
    "Imported",
    "GreenletTask",
    "HYBRID_EVERY",
    "Intent",
    "ResumeWarning",
    "MARKERS",
    "Outcome",
    "Resumption",
    "RunDetail",
    "RunState",
    "SCRIPT_PREFIX",
    "SLEEP_EFFECT",
    "SPAWN_EFFECT",
    "STATE_TAG",
    "STOP",
    "STRATEGIES",
    "TRANSFER_KEY_ENV",
    "SnapshotView",
    "WAIT_EFFECT",
    "Worker",
    "answer",
    "awaiting_decision",
    "cancel",
    "check_retry",
    "decode_error",
    "decode_result",
    "default_snapshot_every",
    "describe_entry",
    "entry_of",
    "error_line",
    "export_run",
    "forgotten_await",
    "flush_tracing",
    "fork",
    "code_state",
    "CODE_POLICIES",
    "upgrade",
    "UpgradePlan",
    "import_run",
    "is_module_entry",
    "load_script",
    "make_transfer_key",
    "owner_alive",
    "pending_waits",
    "read_transfer_key",
    "resume",
    "retry",
    "reusable_run",
    "run",
    "run_detail",
    "script_display_name",
    "script_module_name",
    "send_signal",
    "signal",
    "snapshot_state",
    "split_entry",
    "start",
    "start_resume",
    "submit",
    "traceback_lines",
    "unpack_state",
    "unsupported_await",
    "when",
]


_TRANSFER_NAMES = ("TRANSFER_KEY_ENV", "Exported", "Imported", "export_run", "import_run",
                   "make_transfer_key", "read_transfer_key")
# what `tcc show`, `tcc fork` and the dashboard use, and a `tcc resume` does not
_VIEW_NAMES = ("RunDetail", "SnapshotView", "code_state", "run_detail", "snapshot_state",
               "owner_alive", "when")


def __getattr__(name: str) -> object:
    # greenlet is imported by the first plain-``def`` agent, not by every tcc process
    if name == "GreenletTask":
        from ._sync import GreenletTask

        return GreenletTask
    # what only `tcc upgrade` (and the upgrade policy) uses: ast, dis and the mapping
    if name in ("upgrade", "UpgradePlan"):
        from . import _upgrade

        return _upgrade.upgrade if name == "upgrade" else _upgrade.Plan
    # what only `tcc export`/`tcc import` use (zstandard, the file format)
    if name in _TRANSFER_NAMES:
        from . import _transfer

        return getattr(_transfer, name)
    if name in _VIEW_NAMES:
        from . import _views

        return getattr(_views, name)
    if name == "fork":
        from ._fork import fork

        return fork
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
