"""The lease's heartbeat (``tcc.runtime._lease``): it renews while a drive runs; once
``join_heartbeat`` returns True no renewal is running or will run, so a parked run's released
lease stays released."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tcc import runtime
from tcc.runtime._lease import Lease
from tcc.store import open_store

WAITING_AGENT = '''
import tcc

async def main():
    return await tcc.wait_for("go")
'''


def test_the_heartbeat_renews_until_stopped_and_nothing_renews_after_the_join(tmp_path: Path) -> None:
    with open_store(tmp_path / "store") as store:
        store.create_run("agent.py:main", run_id="r")
        run = store.claim_run("r", lease=0.06)
        lease = Lease(store, "r", run.epoch, 0.06)  # renewed every 20 ms
        first = store.get_run("r").lease_expiry
        lease.start_heartbeat()
        deadline = time.monotonic() + 10
        while store.get_run("r").lease_expiry == first and time.monotonic() < deadline:
            time.sleep(0.01)
        assert store.get_run("r").lease_expiry > first  # renewed
        lease.stop_heartbeat()
        assert lease.join_heartbeat(timeout=10)
        lease.release()
        released = store.get_run("r").lease_expiry
        time.sleep(0.3)  # fifteen renewal periods
        assert store.get_run("r").lease_expiry == released


def test_a_heartbeat_fenced_by_a_takeover_ends_by_itself(tmp_path: Path) -> None:
    with open_store(tmp_path / "store") as store:
        store.create_run("agent.py:main", run_id="r")
        run = store.claim_run("r", lease=0.06)
        lease = Lease(store, "r", run.epoch, 0.06)
        lease.start_heartbeat()
        taken = store.claim_run("r", steal=True, lease=60.0)  # another owner: epoch + 1
        assert lease.join_heartbeat(timeout=10)  # no stop_heartbeat(): its renewal was fenced
        assert store.get_run("r").epoch == taken.epoch


def test_a_parked_run_s_lease_stays_released(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The drive stops its heartbeat before a park releases the lease: a renewal between the
    two (made likely here by a release that takes 0.2 s, ten renewal periods) would leave the
    parked run owned by this process for a whole lease more, and no one could resume it."""
    agent = tmp_path / "waiting.py"
    agent.write_text(WAITING_AGENT)
    real_release = Lease.release

    def slow_release(self: Lease) -> None:
        real_release(self)
        time.sleep(0.2)

    monkeypatch.setattr(Lease, "release", slow_release)
    with open_store(tmp_path / "store") as store:
        outcome = runtime.start(store, str(agent), run_id="r", lease=0.03)
        assert outcome.status == "waiting"
        assert store.get_run("r").lease_expiry <= time.time()  # anyone may resume it
