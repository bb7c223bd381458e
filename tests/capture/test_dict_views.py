"""Dict views and dict iterators are captured as views of, and positions in, their dict.

Plain pickling (and cloudpickle) turns ``d.keys()`` into a view of a *new* dict and an
iterator over ``d.items()`` into an iterator over a list frozen at capture, so a restored
loop read stale values and a restored view never saw its dict change.
"""

from __future__ import annotations

import collections
import gc
import itertools
import threading

import pytest

import tcc
from tcc import errors
from tcc.capture import _blob, _records, safe_loads

KINDS = ("keys", "values", "items")


def roundtrip(obj):
    return tcc.loads(tcc.dumps(obj))


@pytest.mark.parametrize("kind", KINDS)
def test_a_view_stays_a_live_view_of_the_restored_dict(kind):
    d = {"a": 1, "b": [2]}
    d2, view = roundtrip((d, getattr(d, kind)()))
    assert type(view) is type(getattr(d, kind)())
    d2["c"] = 3
    d2["a"] = 10
    assert list(view) == list(getattr(d2, kind)())
    assert len(view) == 3


def test_an_ordered_dict_view_follows_its_own_order():
    od = collections.OrderedDict(a=1, b=2, c=3)
    od2, items = roundtrip((od, od.items()))
    od2.move_to_end("a")
    assert type(items) is type(od.items())
    assert list(items) == [("b", 2), ("c", 3), ("a", 1)]


def test_a_view_alone_brings_its_dict_of_a_subclass():
    counts = collections.Counter("abca")
    view = roundtrip(counts.keys())
    assert sorted(view) == ["a", "b", "c"]
    assert type(view) is type({}.keys())
    (restored,) = gc.get_referents(view)
    assert type(restored) is collections.Counter and restored == counts


def test_a_loop_over_a_dict_that_cannot_be_captured_keeps_a_copy_of_its_keys():
    """`for name in CLIENTS:` over a dict of clients: the dict cannot be captured, so the
    iterator and a keys view are captured as before, as copies of the keys (left to yield)."""
    clients = {"a": threading.Lock(), "b": threading.Lock()}
    it = iter(clients)
    next(it)
    left, keys = roundtrip((it, clients.keys()))
    assert list(left) == ["b"] and list(keys) == ["a", "b"]
    with pytest.raises(errors.CaptureError, match="_thread.lock"):
        tcc.dumps(iter(clients.values()))  # the values themselves: refused, as before


def test_ordered_dict_iterators_are_copies_of_what_is_left():
    od = collections.OrderedDict(a=1, b=2, c=3)
    it = iter(od.items())
    next(it)
    od2, it2 = roundtrip((od, it))
    od2["c"] = 99
    assert list(it2) == [("b", 2), ("c", 3)]  # (a plain dict's would read 99: see README)


@pytest.mark.parametrize("kind, backwards", list(itertools.product(KINDS, (False, True))))
def test_an_iterator_resumes_at_its_position_and_reads_values_then(kind, backwards):
    for consumed in range(5):
        d = {k: k * 10 for k in range(4)}
        view = getattr(d, kind)()
        it = reversed(view) if backwards else iter(view)
        head = list(itertools.islice(it, consumed))
        d2, it2 = roundtrip((d, it))
        assert type(it2) is type(it)
        for k in d2:
            d2[k] += 1  # values change after the restore: the iterator must see them
            d[k] += 1
        now = list(reversed(getattr(d, kind)()) if backwards else getattr(d, kind)())
        assert len(head) == consumed
        assert list(it2) == now[consumed:]
        assert list(it) == now[consumed:]  # (the captured one goes on as before)


def test_the_original_iterator_is_not_advanced_by_a_capture():
    d = {"a": 1, "b": 2, "c": 3}
    it = iter(d.items())
    next(it)
    tcc.dumps(it)
    assert list(it) == [("b", 2), ("c", 3)]


def test_a_dict_deleting_keys_ahead_of_the_iterator_is_captured():
    d = {"x": 1, "y": 2, "z": 3}
    it = iter(d)
    next(it)
    del d["y"]
    d["w"] = 4  # same size again: the live iterator goes on with z, w
    d2, it2 = roundtrip((d, it))
    assert list(it2) == list(it) == ["z", "w"]


def test_an_iterator_over_a_resized_dict_raises_as_the_original_would():
    d = {"x": 1, "y": 2}
    it = iter(d.values())
    next(it)
    del d["x"]  # the next step of `it` raises; a loop left by `break` never takes it
    back = roundtrip(it)
    assert type(back) is type(it)
    with pytest.raises(RuntimeError, match="changed size during iteration"):
        next(back)


def test_an_iterator_whose_keys_changed_under_it_is_refused():
    d = {"x": 1, "y": 2, "z": 3}
    it = iter(d)
    next(it)
    del d["x"]
    d["w"] = 4  # same size, a yielded key replaced: the live iterator raises later
    with pytest.raises(errors.CaptureError, match="keys changed while it was iterated"):
        tcc.dumps(it)


def test_an_exhausted_iterator_stays_exhausted():
    it = iter({"a": 1}.items())
    list(it)
    assert list(roundtrip(it)) == []


def test_an_iterator_reachable_from_its_own_dict_still_loads():
    """The dict is still filling when the iterator is loaded: it comes back over what the
    captured one had left (the cycle is rare; a snapshot that cannot load would strand the run)."""
    d = {"a": 1, "it": None, "b": 2}
    d["it"] = iter(d)
    next(d["it"])
    back = roundtrip(d)
    assert list(back["it"]) == ["it", "b"]


def test_a_view_of_a_module_namespace_is_a_copy():
    view = roundtrip(vars(collections).keys())
    assert "OrderedDict" in view
    (copied,) = gc.get_referents(view)
    assert copied is not vars(collections)


@pytest.mark.parametrize("args", [
    ({"a": 1}, "nope", 0, 1, []),
    ([1], "keys", 0, 1, []),
    ({"a": 1}, "keys", 2, 1, []),
    ({"a": 1}, "keys", 0, 1, ["a", "b"]),
    ({"a": 1}, "keys", True, 1, ["a"]),
])
def test_a_malformed_dict_iterator_record_is_corrupt(args):
    with pytest.raises(errors.CorruptSnapshotError):
        _records.dict_iterator(*args)


def test_malformed_view_records_are_corrupt():
    with pytest.raises(errors.CorruptSnapshotError):
        _records.dict_view({"a": 1}, "odict_keys")
    with pytest.raises(errors.CorruptSnapshotError):
        _records.dict_view([1], "keys")
    with pytest.raises(errors.CorruptSnapshotError):
        _records.dict_iterator_resized("values ")


def test_the_restricted_loader_shows_views_and_iterators():
    d = {"a": 1, "b": 2}
    it = iter(d.items())
    next(it)
    shown = safe_loads(_blob.unseal(tcc.dumps((d, d.values(), it))))
    assert list(shown[1]) == [1, 2]
    assert list(shown[2]) == [("b", 2)]
