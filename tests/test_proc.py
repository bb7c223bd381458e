"""tcc._proc.pid_alive: ownership checks must not mistake a zombie for a live owner."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from tcc._proc import pid_alive


def test_live_process_is_alive() -> None:
    assert pid_alive(os.getpid())


def test_zombie_is_not_alive() -> None:
    """Regression (found by the kill campaign): kill(pid, 0) succeeds for an unreaped process,
    so a SIGKILLed owner whose parent had not reaped it yet kept its runs blocked."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with open(f"/proc/{child.pid}/stat", "rb") as fh:
                if b") Z" in fh.read():
                    break
            time.sleep(0.01)
        else:
            raise AssertionError("the child never became a zombie")
        assert not pid_alive(child.pid)
    finally:
        child.wait()
    assert not pid_alive(child.pid)


def test_nonsense_pids_are_not_alive() -> None:
    assert not pid_alive(0) and not pid_alive(-5)
