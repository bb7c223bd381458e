"""The runtime: drive a run, checkpoint after effects, recover after a crash."""

from ._driver import Driver as Driver
from ._driver import Intent as Intent
from ._driver import Outcome as Outcome
from ._fork import fork as fork
from ._driver import STOP as STOP
from ._runs import STRATEGIES as STRATEGIES
from ._worker import Worker as Worker
from ._worker import pending_waits as pending_waits
from ._runs import resume as resume
from ._runs import retry as retry
from ._runs import reusable_run as reusable_run
from ._runs import send_signal as send_signal
from ._runs import start as start
from ._scripts import load_script as load_script

__all__ = [
    "STOP",
    "STRATEGIES",
    "Driver",
    "Intent",
    "Outcome",
    "Worker",
    "fork",
    "load_script",
    "pending_waits",
    "resume",
    "retry",
    "reusable_run",
    "send_signal",
    "start",
]
