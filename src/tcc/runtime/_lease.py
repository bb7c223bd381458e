"""The lease: this process's claim to drive a run, as the owner of one epoch.

While a drive runs, a heartbeat thread renews the lease every third of its length, so
that no worker takes the run over from a live process.  Every commit is fenced by the
store (a write of a stale epoch fails); :meth:`Lease.check_owner` is the read-only check
for the places that wait without committing (a wait for a signal, a sleep, a stuck
thread), so that a cancel or a takeover (``--steal``) is noticed there too.
"""

from __future__ import annotations

import threading

from .. import errors
from ..store import Store


class Lease:
    """The lease on run ``run_id`` that this process holds as the owner of ``epoch``."""

    def __init__(self, store: Store, run_id: str, epoch: int, seconds: float) -> None:
        self.store = store
        self.run_id = run_id
        self.epoch = epoch
        self.seconds = seconds
        self._stop_heartbeat = threading.Event()
        self._heartbeat_thread: threading.Thread | None = None

    def check_owner(self, doing: str) -> None:
        """Raise FencedError if the run was cancelled or taken over (a read: no write)."""
        run = self.store.get_run(self.run_id)
        if run.epoch == self.epoch:
            return
        if run.status == "cancelled":
            why = "was cancelled"
        else:
            why = (f"was taken over (now epoch {run.epoch}, owner "
                   f"{run.owner_host}:{run.owner_pid})")
        raise errors.FencedError(
            f"run {self.run_id} {why} while this process (epoch {self.epoch}) {doing}, so "
            "it stops here; nothing more was written")

    def start_heartbeat(self) -> None:
        """Renew the lease in a daemon thread until :meth:`stop_heartbeat`."""
        self._heartbeat_thread = threading.Thread(target=self._heartbeat, name="tcc-lease", daemon=True)
        self._heartbeat_thread.start()

    def stop_heartbeat(self) -> None:
        """Renew no more (the thread ends at its next wake-up; :meth:`join_heartbeat`)."""
        self._stop_heartbeat.set()

    def join_heartbeat(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the heartbeat's thread to end (after
        :meth:`stop_heartbeat`).  True once it has: no renewal runs or will run.  False if a
        renewal is still stuck in the store after ``timeout``; it may still land."""
        if self._heartbeat_thread is not None:
            self._heartbeat_thread.join(timeout=timeout)
            return not self._heartbeat_thread.is_alive()
        return True

    def release(self) -> None:
        """Let anyone resume the run now (a parked run); a lost lease is no error here."""
        try:
            self.store.renew_lease(self.run_id, self.epoch, 0.0)
        except errors.TccError:
            pass

    def _heartbeat(self) -> None:
        while not self._stop_heartbeat.wait(self.seconds / 3):
            try:
                self.store.renew_lease(self.run_id, self.epoch, self.seconds)
            except errors.TccError:
                return  # fenced or closed: the next commit reports it
