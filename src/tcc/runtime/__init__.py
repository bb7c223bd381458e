"""The runtime: drive a run, checkpoint after effects, recover after a crash."""

from ._driver import Driver as Driver
from ._driver import Intent as Intent
from ._driver import Outcome as Outcome
from ._fork import fork as fork
from ._runs import STRATEGIES as STRATEGIES
from ._runs import resume as resume
from ._runs import start as start
from ._scripts import load_script as load_script

__all__ = ["STRATEGIES", "Driver", "Intent", "Outcome", "fork", "load_script", "resume", "start"]
