"""The envelope of a snapshot kept in a store: no digest of its own, read only as authenticated.

A store authenticates every byte of a snapshot it returns, so the runtime seals the
snapshots it hands to a store ``stored=True`` (no BLAKE2b pass over the whole state at
every step); such a blob must never be accepted where nothing authenticated it.
"""

from __future__ import annotations

import pytest

import tcc
from tcc.capture import _blob, dump_payload, dump_stored, load_payload, unseal
from tcc.errors import CorruptSnapshotError


def _flags_and_digest(blob: bytes) -> tuple[int, bytes]:
    pos = _blob._FIXED.size + len(_blob.interpreter_tag())
    return blob[pos], blob[pos + 1:pos + 1 + _blob._DIGEST]


def test_a_stored_blob_has_no_digest_and_reads_back_when_authenticated() -> None:
    state = {"transcript": ["hello"] * 100, "n": 7}
    payload = dump_payload(state)
    blob = _blob.seal(payload, compress=False, stored=True)
    flags, digest = _flags_and_digest(blob)
    assert flags == _blob.FLAG_STORED and digest == bytes(16)
    assert unseal(blob, authenticated=True) == payload
    assert load_payload(unseal(blob, authenticated=True)) == state


def test_dump_stored_is_the_stored_seal_of_the_pickle_without_a_copy() -> None:
    state = {"transcript": [f"message {i}" for i in range(500)], "nested": {"a": [1, 2.5, None]}}
    blob = dump_stored(state)
    assert blob == _blob.seal(dump_payload(state), compress=False, stored=True)
    assert blob.startswith(_blob.stored_header())
    assert load_payload(unseal(blob, authenticated=True)) == state


@pytest.mark.parametrize("read", [tcc.loads, unseal], ids=["tcc.loads", "unseal"])
def test_a_stored_blob_is_refused_where_nothing_authenticated_it(read) -> None:
    blob = _blob.seal(dump_payload([1, 2, 3]), compress=False, stored=True)
    with pytest.raises(CorruptSnapshotError, match="no digest of its own.*read only from there"):
        read(blob)


def test_a_stored_blob_with_a_digest_is_damaged() -> None:
    blob = bytearray(_blob.seal(dump_payload("x"), compress=False, stored=True))
    pos = _blob._FIXED.size + len(_blob.interpreter_tag()) + 1
    blob[pos] ^= 0x01
    with pytest.raises(CorruptSnapshotError, match="envelope is damaged"):
        unseal(bytes(blob), authenticated=True)


def test_a_blob_with_a_digest_is_still_checked_when_authenticated() -> None:
    """Snapshots written before stored blobs existed carry a digest: still verified."""
    payload = dump_payload({"a": 1})
    blob = _blob.seal(payload, compress=False)
    assert unseal(blob, authenticated=True) == payload
    damaged = bytearray(blob)
    damaged[-1] ^= 0xFF
    with pytest.raises(CorruptSnapshotError, match="fails its integrity check"):
        unseal(bytes(damaged), authenticated=True)


def test_unknown_flags_are_refused_before_the_payload_is_read() -> None:
    blob = bytearray(_blob.seal(dump_payload("x"), compress=False, stored=True))
    pos = _blob._FIXED.size + len(_blob.interpreter_tag())
    blob[pos] |= 0x80
    with pytest.raises(CorruptSnapshotError, match="unknown snapshot flags"):
        unseal(bytes(blob), authenticated=True)


def test_the_runtime_stores_snapshots_without_a_digest(tmp_path) -> None:
    from tcc.store import open_store

    script = tmp_path / "agent.py"
    script.write_text(
        "import tcc\n\n@tcc.effect\ndef add(x):\n    return x + 1\n\n"
        "async def main():\n    n = 0\n    for _ in range(3):\n        n = await add(n)\n    return n\n")
    from tcc import runtime

    with open_store(tmp_path / "store") as store:
        outcome = runtime.start(store, str(script), [], run_id="r")
        assert outcome.status == "completed" and outcome.result == 3
        info = store.snapshots("r")[-1]
        blob = store.load_snapshot("r", info.number)
    flags, digest = _flags_and_digest(blob)
    assert flags & _blob.FLAG_STORED and digest == bytes(16)
    with pytest.raises(CorruptSnapshotError):
        tcc.loads(blob)
