"""A journaled completion answers an open intent of its run, once.

The journal is the run's record of which effects ran: an intent before an
effect, its completion after.  A completion that names no intent, names a
completion, or answers an intent a second time would make the record say
something that did not happen; the store refuses it (UsageError) and writes
nothing of the transaction, snapshot included.
"""

from __future__ import annotations

import pytest

from tcc.errors import UsageError
from tcc.store import Completion, open_store
from tests._support.stores import payload


@pytest.fixture()
def store(tmp_path):
    with open_store(str(tmp_path / "s")) as s:
        yield s


def _state(store, run_id):
    return [(r.kind, r.intent_seq) for r in store.journal(run_id)], [
        i.number for i in store.snapshots(run_id)]


def test_completions_answer_open_intents_in_any_order(store):
    """Several intents open at once (one tcc.gather) are answered in any order."""
    run = store.create_run("e").run_id
    seqs = [store.append_intent(run, 1, f"tool{i}") for i in range(3)]
    assert seqs == [0, 1, 2]
    store.append_completion(run, 1, Completion(2, result=b"c"))
    store.checkpoint(run, 1, payload(1, 20_000), completion=Completion(0, result=b"a"))
    store.append_completion(run, 1, Completion(1, error=b"b"))
    journal, snaps = _state(store, run)
    assert journal == [("intent", None)] * 3 + [("completion", 2), ("completion", 0), ("completion", 1)]
    assert snaps == [1]


@pytest.mark.parametrize("via", ["append_completion", "checkpoint"])
def test_a_second_completion_of_an_intent_is_refused(store, via):
    run = store.create_run("e").run_id
    seq = store.append_intent(run, 1, "llm")
    store.checkpoint(run, 1, payload(1, 20_000), completion=Completion(seq, result=b"first"))
    other = store.append_intent(run, 1, "tool")  # a record between the two completions
    before = _state(store, run)
    with pytest.raises(UsageError, match=r"intent 0 \(llm\) of run .* already has its completion "
                                         r"\(journal record 1\)"):
        if via == "checkpoint":
            store.checkpoint(run, 1, payload(2, 20_000), completion=Completion(seq, result=b"again"))
        else:
            store.append_completion(run, 1, Completion(seq, result=b"again"))
    assert _state(store, run) == before  # nothing written: no completion, no snapshot
    assert store.load_snapshot(run) == payload(1, 20_000)
    store.append_completion(run, 1, Completion(other, result=b"ok"))  # the open one still can


def test_a_completion_must_name_an_intent(store):
    run = store.create_run("e").run_id
    with pytest.raises(UsageError, match="names intent 0, but the run's journal has 0 records"):
        store.append_completion(run, 1, Completion(0))
    seq = store.append_intent(run, 1, "llm")
    done = store.append_completion(run, 1, Completion(seq))
    with pytest.raises(UsageError, match="names intent 5, but the run's journal has 2 records"):
        store.checkpoint(run, 1, payload(1, 20_000), completion=Completion(5))
    with pytest.raises(UsageError, match=f"names journal record {done}, which is a completion "
                                         f"\\(of intent {seq}\\), not an intent"):
        store.append_completion(run, 1, Completion(done))
    with pytest.raises(UsageError, match="intent_seq must be an integer of at least 0"):
        store.append_completion(run, 1, Completion(-1))
    assert _state(store, run) == ([("intent", None), ("completion", 0)], [])


def test_intents_of_another_run_do_not_count(store):
    a = store.create_run("e").run_id
    b = store.create_run("e").run_id
    store.append_intent(a, 1, "llm")
    store.append_intent(b, 1, "llm")
    store.append_completion(a, 1, Completion(0))
    store.append_completion(b, 1, Completion(0))  # b's own intent 0, still open
    with pytest.raises(UsageError, match="already has its completion"):
        store.append_completion(b, 1, Completion(0))


def _journal_reads(store, monkeypatch) -> list[int]:
    """Count the journal records the store verifies from now on."""
    reads = [0]
    kind = type(store._scope.sealer)
    real = kind.open

    def counting(self, db, key, value):
        if db == b"journal":
            reads[0] += 1
        return real(self, db, key, value)

    monkeypatch.setattr(kind, "open", counting)
    return reads


def test_a_wide_gather_is_checked_without_rereading_the_journal(store, monkeypatch):
    """N open intents answered one by one cost O(N) record reads in all, not O(N^2):
    a completion does not reread every record from its intent on, so a wide gather
    stays fast."""
    n = 300
    run = store.create_run("e").run_id
    seqs = [store.append_intent(run, 1, f"tool{i}") for i in range(n)]
    reads = _journal_reads(store, monkeypatch)
    for seq in seqs:
        store.append_completion(run, 1, Completion(seq, result=b"ok"))
    assert reads[0] <= n  # (it was n * n: about 60,000 here)
    with pytest.raises(UsageError, match="already has its completion"):
        store.append_completion(run, 1, Completion(seqs[7]))  # refused all the same


def test_what_another_handle_journaled_is_seen(tmp_path):
    """A completion journaled through another handle (another process, in effect)
    answers the intent for this one too: its memory of open intents does not let a
    second completion through."""
    path = str(tmp_path / "s")
    with open_store(path) as one, open_store(path) as two:
        run = one.create_run("e").run_id
        a = one.append_intent(run, 1, "llm")
        b = one.append_intent(run, 1, "tool")
        two.append_completion(run, 1, Completion(a, result=b"there"))
        with pytest.raises(UsageError, match=r"intent 0 \(llm\) .* already has its completion"):
            one.append_completion(run, 1, Completion(a, result=b"here"))
        one.append_completion(run, 1, Completion(b))
        assert [(r.kind, r.intent_seq) for r in one.journal(run)] == [
            ("intent", None), ("intent", None), ("completion", 0), ("completion", 1)]


def test_a_run_created_again_under_its_id_starts_afresh(tmp_path):
    """A run deleted and created again under the same id (here through another handle):
    what this handle remembered of the old run's open intents does not answer for the
    new run's records."""
    path = str(tmp_path / "s")
    with open_store(path) as one, open_store(path) as two:
        run = one.create_run("e", run_id="same").run_id
        one.append_intent(run, 1, "llm")
        one.append_intent(run, 1, "tool")  # one remembers intents 0 and 1 as open
        two.delete_run(run)
        two.create_run("e", run_id="same")
        two.append_intent(run, 1, "llm")
        two.append_completion(run, 1, Completion(0))  # the new run's record 1: a completion
        with pytest.raises(UsageError, match="names journal record 1, which is a completion"):
            one.append_completion(run, 1, Completion(1))


def test_a_handle_behind_reads_from_the_intent(tmp_path, monkeypatch):
    """A handle whose memory ends well before the intent it completes (another process
    drove the run meanwhile) reads from the intent, not from where its memory ends."""
    path = str(tmp_path / "s")
    with open_store(path) as one, open_store(path) as two:
        run = one.create_run("e").run_id
        one.append_intent(run, 1, "llm")
        newest = [two.append_intent(run, 1, "tool") for _ in range(300)][-1]
        reads = _journal_reads(one, monkeypatch)
        one.append_completion(run, 1, Completion(newest))
        assert reads[0] <= 2  # (it was 301)
