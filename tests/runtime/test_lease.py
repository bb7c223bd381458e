"""The lease's heartbeat (``tcc.runtime._lease``): it renews while a drive runs, and once
``join_heartbeat`` returns no renewal is running or will run (a parked run's released lease
must stay released)."""

from __future__ import annotations

import time
from pathlib import Path

from tcc.runtime._lease import Lease
from tcc.store import open_store


def _lease_expiry(store, run_id: str) -> float:  # type: ignore[no-untyped-def]
    return store.get_run(run_id).lease_expiry


def test_the_heartbeat_renews_until_stopped_and_nothing_renews_after_the_join(tmp_path: Path) -> None:
    with open_store(tmp_path / "store") as store:
        run = store.create_run("agent.py:main", run_id="r")
        run = store.claim_run("r", lease=0.06)
        lease = Lease(store, "r", run.epoch, 0.06)  # renewed every 20 ms
        first = _lease_expiry(store, "r")
        lease.start_heartbeat()
        deadline = time.monotonic() + 10
        while _lease_expiry(store, "r") == first and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _lease_expiry(store, "r") > first  # renewed
        lease.stop_heartbeat()
        lease.join_heartbeat(timeout=10)
        lease.release()  # as a parked run does: anyone may resume it now
        released = _lease_expiry(store, "r")
        time.sleep(0.3)  # fifteen renewal periods
        assert _lease_expiry(store, "r") == released


def test_a_heartbeat_fenced_by_a_takeover_ends_by_itself(tmp_path: Path) -> None:
    with open_store(tmp_path / "store") as store:
        store.create_run("agent.py:main", run_id="r")
        run = store.claim_run("r", lease=0.06)
        lease = Lease(store, "r", run.epoch, 0.06)
        lease.start_heartbeat()
        taken = store.claim_run("r", steal=True, lease=60.0)  # another owner: epoch + 1
        lease.join_heartbeat(timeout=10)  # no stop_heartbeat(): its renewal was fenced
        assert lease._heartbeat_done is not None and lease._heartbeat_done.is_set()
        assert store.get_run("r").epoch == taken.epoch
