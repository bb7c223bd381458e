"""Large buffers out of band (``tcc.capture._framed``): what a dump hands the store, and
that every form loads back as it was -- type, value, sharing -- by both loaders."""

from __future__ import annotations

import io
import pickle

import pytest

from tcc import errors
from tcc.capture import SegmentCache, _framed, dump_stored, load_payload, native_available, safe_loads, unseal
from tcc.capture._records import BUFFER_PID

pytestmark = pytest.mark.skipif(not native_available(), reason="needs the native module")

BIG = _framed.MIN_BYTES


def _payload(pieces):
    joined = b"".join(pieces) if isinstance(pieces, tuple) else pieces
    return unseal(joined, authenticated=True)


class Array:
    """Stands for a numpy array: protocol 5 hands its memory to the pickler as a buffer."""

    def __init__(self, data):
        self.data = data

    def __reduce_ex__(self, protocol):
        return Array, (pickle.PickleBuffer(self.data),)


def test_large_values_leave_the_pickle_and_the_same_bytes_object_is_handed_on():
    blob = bytes(range(256)) * (BIG // 256 + 1)
    state = {"blob": blob, "again": [blob], "buf": bytearray(BIG), "small": b"x" * 100,
             "array": Array(bytearray(b"a" * BIG))}
    pieces = dump_stored(state, segments=SegmentCache())
    assert isinstance(pieces, tuple) and len(pieces) == 4  # stream, blob, buf, array
    assert pieces[1] is blob  # the object itself: a store may know it by identity
    assert len(pieces[0]) < 2000  # nothing large stayed in the pickle
    back = load_payload(_payload(pieces))
    assert back["blob"] == blob and type(back["blob"]) is bytes
    assert back["again"][0] is back["blob"]
    assert type(back["buf"]) is bytearray and back["buf"] == bytearray(BIG)
    back["buf"][0] = 1  # a bytearray comes back mutable
    assert back["small"] == b"x" * 100
    assert bytes(back["array"].data) == b"a" * BIG


def test_without_large_values_the_payload_is_one_plain_pickle():
    payload = dump_stored({"small": b"x" * (BIG - 1), "n": 1}, segments=SegmentCache())
    assert isinstance(payload, bytes)
    assert not _framed.is_framed(_payload(payload))


def test_the_display_loader_reads_out_of_band_values():
    blob = b"\x01" * BIG
    view = safe_loads(_payload(dump_stored({"blob": blob, "buf": bytearray(BIG)},
                                           segments=SegmentCache())))
    assert view["blob"] == blob and type(view["buf"]) is bytearray


@pytest.mark.parametrize("cut", [3, 7, 12, 20])
def test_a_damaged_frame_is_refused_before_anything_is_loaded(cut):
    payload = _payload(dump_stored({"blob": b"\x02" * BIG}, segments=SegmentCache()))
    assert _framed.is_framed(payload)
    damaged = payload[:cut]
    with pytest.raises(errors.CorruptSnapshotError):
        load_payload(damaged)
    with pytest.raises(errors.CorruptSnapshotError):
        _framed.unframe(damaged)


def test_a_frame_naming_more_buffers_than_it_holds_is_refused():
    hostile = _framed.head([1 << 60, 5]) + b"\x80\x05."
    with pytest.raises(errors.CorruptSnapshotError, match="shorter than the buffers"):
        load_payload(hostile)
    with pytest.raises(errors.CorruptSnapshotError, match="more than its"):
        _framed.unframe(_framed.MAGIC + b"\xff\xff\xff\xff")


def test_hostile_out_of_band_ids_are_refused_by_the_loader_and_stubbed_for_display():
    for pid in ((BUFFER_PID, "str", b"abc"), (BUFFER_PID, "bytes", 5), (BUFFER_PID, b"bytes", b"x")):
        class P(pickle.Pickler):
            def persistent_id(self, obj, pid=pid):
                return pid if obj == "here" else None

        out = io.BytesIO()
        P(out, protocol=5).dump(["here"])
        with pytest.raises(errors.CorruptSnapshotError, match="out-of-band value"):
            load_payload(out.getvalue())
        shown = safe_loads(out.getvalue())
        assert repr(shown[0]) == "<persistent id (not rebuilt: not a value tcc wrote)>"
