"""How a drive ends before its run does, leaving the run resumable: it parks.

A run parks while it waits for a signal, sleeps past the inline limit or waits for a
child run, and it stops (status ``stopped``) when SIGTERM sets :data:`STOP`: after the
current commit, and before any attempt or call that has not started.  Code deep inside
a step raises :class:`Parked`; :meth:`Driver.drive` catches it, releases the lease and
returns the parked :class:`Outcome`.
"""

from __future__ import annotations

import threading
from typing import Any

STOP = threading.Event()  # set by SIGTERM: stop after the current commit


class Parked(Exception):
    """The run is waiting for a signal or sleeping (or was stopped): the process may exit."""

    def __init__(self, status: str, info: dict[str, Any]) -> None:
        super().__init__(status)
        self.status = status
        self.info = info
