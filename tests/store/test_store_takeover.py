"""A takeover while the owner keeps writing: the claim wins, the old owner is fenced.

The PostgreSQL store claims in two round trips (read the run row, then claim that
row version with its event in one statement) and, if the owner wrote in between,
again holding the row's lock; LMDB claims under its write lock.  Either way the
claim must succeed against an owner that commits step after step, the old owner's
next write must raise FencedError and write nothing, and the journal must stay
gapless with each intent answered at most once.
"""

from __future__ import annotations

import os
import threading
import time

import pytest

from tcc.errors import FencedError
from tcc.store import Completion, Store
from tests._support.backends import Site


def _owner_steps(store: Store, run_id: str, epoch: int, done: list[object]) -> None:
    """Commit intent + checkpoint steps until fenced; record how many and the error."""
    steps = 0
    try:
        while True:
            seq = store.append_intent(run_id, epoch, "step", b"%d" % steps)
            store.checkpoint(run_id, epoch, os.urandom(64) * 200,
                             completion=Completion(seq, result=b"ok"))
            steps += 1
    except FencedError as exc:
        done[:] = [steps, exc]
    except BaseException as exc:  # pragma: no cover - reported by the assertion below
        done[:] = [steps, exc]


@pytest.mark.parametrize("rounds", [3])
def test_claim_against_an_owner_that_keeps_writing(site: Site, rounds: int) -> None:
    with site.open() as owner_store, site.open() as claimer:
        run = owner_store.create_run("agent.py:main", b"", run_id="busy")
        epoch = run.epoch
        for _ in range(rounds):
            done: list[object] = []
            thread = threading.Thread(target=_owner_steps, args=(owner_store, "busy", epoch, done))
            thread.start()
            time.sleep(0.2)  # the owner is mid-stream
            claimed = claimer.claim_run("busy", steal=True)
            thread.join(timeout=60)
            assert not thread.is_alive()
            steps, error = done
            assert isinstance(error, FencedError), error
            assert claimed.epoch == epoch + 1
            assert claimer.get_run("busy").epoch == claimed.epoch  # the fenced write wrote nothing
            epoch = claimed.epoch
        records = claimer.journal("busy")
        assert [r.seq for r in records] == list(range(len(records)))
        answered = [r.intent_seq for r in records if r.kind == "completion"]
        assert len(answered) == len(set(answered))
        kinds = [e.kind for e in claimer.events("busy")]
        assert kinds.count("taken_over") + kinds.count("reclaimed") == rounds
