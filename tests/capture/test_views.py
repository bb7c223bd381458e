"""memoryview and MappingProxyType are restored as views of the restored object, never as
copies of it; Counter and defaultdict keep their instance's own attributes."""

from __future__ import annotations

import array
import collections
import types

import pytest

import tcc
from tcc import errors
from tcc.capture import _blob, _records, safe_loads


def test_a_memoryview_window_stays_a_window_of_its_restored_bytearray() -> None:
    buf = bytearray(b"." * 16)
    out = tcc.loads(tcc.dumps({"buf": buf, "win": memoryview(buf)[4:8]}))
    assert type(out["win"]) is memoryview and not out["win"].readonly
    out["win"][:] = b"AAAA"
    assert out["buf"] == bytearray(b"....AAAA........")
    out["buf"][4] = ord("z")
    assert out["win"].tobytes() == b"zAAA"


def test_a_view_alone_brings_its_object_and_keeps_format_shape_and_readonly() -> None:
    arr = array.array("i", range(6))
    view, ro = tcc.loads(tcc.dumps((memoryview(arr)[2:4], memoryview(b"hello world")[6:])))
    assert (view.format, view.shape, view.tolist()) == ("i", (2,), [2, 3])
    assert type(view.obj) is array.array and view.obj.tolist() == list(range(6))
    assert ro.readonly and ro.tobytes() == b"world"
    grid = memoryview(bytearray(range(12))).cast("B", (3, 4))
    again = tcc.loads(tcc.dumps(grid))
    assert again.shape == (3, 4) and again.tolist() == grid.tolist()
    made_readonly = tcc.loads(tcc.dumps(memoryview(bytearray(b"abc")).toreadonly()))
    assert made_readonly.readonly and made_readonly.tobytes() == b"abc"


def test_a_view_of_a_large_buffer_out_of_band_is_still_its_window() -> None:
    big = bytearray(200_000)
    restored, window = tcc.loads(tcc.dumps([big, memoryview(big)[100:200]]))
    window[0:3] = b"xyz"
    assert restored[100:103] == b"xyz"


@pytest.mark.parametrize("make, why", [
    (lambda: memoryview(bytearray(10))[::2], "not a contiguous window"),
    (lambda: _released(), "a released memoryview"),
])
def test_a_view_tcc_cannot_place_is_refused_not_copied(make, why) -> None:
    with pytest.raises(errors.CaptureError, match=why):
        tcc.dumps(make())


def _released() -> memoryview:
    view = memoryview(bytearray(4))
    view.release()
    return view


def test_a_malformed_view_record_is_a_corrupt_snapshot() -> None:
    with pytest.raises(errors.CorruptSnapshotError, match="reaches past"):
        _records.memoryview_of(bytearray(4), 2, 8, "B", (8,), False)
    with pytest.raises(errors.CorruptSnapshotError, match="malformed memoryview"):
        _records.memoryview_of(bytearray(4), "0", 4, "B", (4,), False)
    with pytest.raises(errors.CorruptSnapshotError, match="malformed memoryview"):
        _records.memoryview_of(bytearray(4), 0, 3, "i", (1,), False)


def test_a_mapping_proxy_stays_a_proxy_of_its_restored_dict() -> None:
    tools = {"alpha": 1}
    out = tcc.loads(tcc.dumps({"tools": tools, "known": types.MappingProxyType(tools)}))
    out["tools"]["beta"] = 2
    assert dict(out["known"]) == {"alpha": 1, "beta": 2}
    alone = tcc.loads(tcc.dumps(types.MappingProxyType({"x": [1]})))
    assert type(alone) is types.MappingProxyType and alone["x"] == [1]


def test_a_class_namespace_proxy_is_still_a_copy_of_its_data() -> None:
    class Config:
        retries = 3

    copied = tcc.loads(tcc.dumps(Config.__dict__))
    assert type(copied) is types.MappingProxyType and copied["retries"] == 3


class TokenBudget(collections.Counter):
    limit = 1000


class Tagged(collections.defaultdict):
    __slots__ = ("tag",)


def test_counter_and_defaultdict_keep_their_instance_attributes() -> None:
    budget = TokenBudget(a=3)
    budget.limit = 200
    tagged = Tagged(list)
    tagged.tag = "x"
    tagged["k"].append(1)
    plain = collections.Counter(z=1)
    plain.note = "n"
    out = tcc.loads(tcc.dumps([budget, tagged, plain, collections.defaultdict(int, q=2), budget]))
    assert out[0] == {"a": 3} and out[0].limit == 200 and out[4] is out[0]
    assert type(out[1]) is Tagged and out[1].tag == "x" and out[1].default_factory is list
    assert out[1] == {"k": [1]} and out[2].note == "n"
    assert out[3] == {"q": 2} and out[3].default_factory is int


def test_the_restricted_loader_shows_views_without_building_them() -> None:
    tools = {"a": 1}
    shown = safe_loads(_blob.unseal(tcc.dumps({"p": types.MappingProxyType(tools),
                                               "m": memoryview(bytearray(b"abc"))[1:]})))
    assert "memoryview_of" in repr(shown["m"])
    assert "MappingProxyType" in repr(shown["p"])


class Guarded(collections.Counter):
    """A Counter subclass with a __reduce__ of its own, which leaves its lock out."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)
        import threading

        self.lock = threading.Lock()

    def __reduce__(self) -> tuple[object, ...]:
        return (Guarded, (dict(self),))


def test_a_counter_subclass_with_its_own_reduce_is_pickled_its_way() -> None:
    out = tcc.loads(tcc.dumps(Guarded({"a": 1})))
    assert type(out) is Guarded and out == {"a": 1} and hasattr(out, "lock")
