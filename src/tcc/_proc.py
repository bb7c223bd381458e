"""Whether a process on this host is alive, for lease and ownership checks."""

from __future__ import annotations

import os

__all__ = ["pid_alive", "proc_stat"]


def proc_stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (state first, then the
    parent's pid, ... the start time at index 19), or None (no such process, no procfs).
    The command name is parenthesised and may itself contain ") "."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read().decode("ascii", "replace")
    except OSError:
        return None
    return data[data.rfind(")") + 2:].split()


def pid_alive(pid: int) -> bool:
    """True if process ``pid`` exists and is not a zombie.

    ``kill(pid, 0)`` succeeds for a zombie -- a process killed but not yet
    reaped by its parent (or, in a container, by a slow PID 1) -- which would
    keep a dead owner's runs blocked until its lease ran out.  A process we
    may not signal (PermissionError) counts as alive.
    """
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:  # no procfs (or it just exited): trust kill()
        return True
    # the state follows the parenthesised command name, which may contain ") "
    state = stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3]
    return state not in (b"Z", b"X")
