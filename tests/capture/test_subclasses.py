"""The program's subclasses of built-in value types round-trip whole (tcc.capture._subclasses):
made by the base, filled through the base's methods, attributes last; classes with their own
pickling are left to it."""

from __future__ import annotations

import collections
import copyreg
import datetime
import decimal
import enum
import fractions
import random
from typing import Any, NamedTuple

import pytest

import tcc
from tcc.capture import _subclasses


class Audited(dict):
    """Its __setitem__ reads an attribute __init__ sets: pickle's SETITEMS ran it first."""

    def __init__(self, owner: str) -> None:
        super().__init__()
        self.owner = owner
        self.log: list[str] = []

    def __setitem__(self, key: Any, value: Any) -> None:
        self.log.append(f"{self.owner} set {key}")
        super().__setitem__(key, value)


class Slotted(list):
    __slots__ = ("tag",)

    def __init__(self, tag: str) -> None:
        super().__init__()
        self.tag = tag


class Stamp(datetime.datetime):
    pass


class Ratio(fractions.Fraction):
    pass


class Role(str):
    def __new__(cls, text: str, role: str) -> "Role":
        obj = super().__new__(cls, text)
        obj.role = role
        return obj


class Dice(random.Random):
    def __init__(self, seed: int, tag: str) -> None:
        super().__init__(seed)
        self.tag = tag


class Point(NamedTuple):
    x: int
    y: int


class Level(enum.IntEnum):
    LOW = 1


class Single:
    _made: "Single | None" = None

    def __new__(cls) -> "Single":  # no arguments: pickle's default keeps the singleton
        if cls._made is None:
            cls._made = super().__new__(cls)
        return cls._made


class Custom(dict):
    def __reduce__(self) -> Any:
        return (Custom, (), None, None, iter(self.items()))


class Stateful(set):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def __getstate__(self) -> Any:
        return {"n": self.n * 100}

    def __setstate__(self, state: Any) -> None:
        self.n = state["n"] // 100


def round_trip(obj: Any) -> Any:
    return tcc.loads(tcc.dumps(obj))


def test_mutable_subclasses_keep_content_order_and_attributes() -> None:
    audited = Audited("ann")
    audited["a"] = 1
    audited["b"] = 2
    back = round_trip(audited)
    assert type(back) is Audited and back == {"a": 1, "b": 2} and back.owner == "ann"
    assert back.log == ["ann set a", "ann set b"]  # filled by dict's own methods, not its __setitem__
    slotted = Slotted("t")
    slotted.extend([3, 1, 2])
    back = round_trip(slotted)
    assert type(back) is Slotted and back == [3, 1, 2] and back.tag == "t"
    stateful = Stateful(4)
    stateful.update({1, 2})
    back = round_trip(stateful)
    assert back == {1, 2} and back.n == 4  # its own __getstate__/__setstate__ say how


def test_value_subclasses_keep_their_attributes() -> None:
    stamp = Stamp(2026, 12, 5, 14, 0, tzinfo=datetime.timezone.utc)
    stamp.source = "sensor"
    back = round_trip(stamp)
    assert type(back) is Stamp and back == stamp and back.source == "sensor"
    ratio = Ratio(3, 4)
    ratio.unit = "kg"
    back = round_trip(ratio)
    assert type(back) is Ratio and back == fractions.Fraction(3, 4) and back.unit == "kg"
    role = Role("hello", "system")
    back = round_trip(role)
    assert type(back) is Role and back == "hello" and back.role == "system"


def test_a_random_subclass_continues_its_sequence() -> None:
    dice = Dice(7, "planner")
    dice.random()
    back = round_trip(dice)
    assert type(back) is Dice and back.tag == "planner"
    assert [back.random() for _ in range(3)] == [dice.random() for _ in range(3)]


def test_shared_and_self_referencing_instances_stay_one_object() -> None:
    audited = Audited("cy")
    audited["self"] = audited
    pair = [audited, audited]
    back = round_trip(pair)
    assert back[0] is back[1] and back[0]["self"] is back[0]


def test_classes_with_their_own_pickling_are_left_to_it() -> None:
    for t in (Point, Level, Custom, Single, decimal.Decimal, collections.OrderedDict):
        assert _subclasses.reducer_for(t) is None, t
    assert round_trip(Point(1, 2)) == Point(1, 2) and round_trip(Level.LOW) is Level.LOW
    assert round_trip(Single()) is Single()  # the no-argument __new__ still runs
    assert round_trip(Custom(a=1)) == {"a": 1}


class Registered(dict):
    pass


def _reduce_registered(obj: Registered) -> Any:
    return (Registered, (), None, None, iter([("via", "copyreg")]))


class Symbol:
    def __new__(cls, name: str) -> "Symbol":
        obj = super().__new__(cls)
        obj.name = name
        return obj


class Marker:
    """A stateless class whose __new__ takes a label, bound at module level: a sentinel."""

    __slots__ = ()

    def __new__(cls, label: str) -> "Marker":
        return super().__new__(cls)


MISSING = Marker("missing")


def test_fold_copyreg_sentinels_and_refused_new() -> None:
    stamp = Stamp(2021, 11, 7, 1, 30, fold=1)
    assert round_trip(stamp).fold == 1
    copyreg.pickle(Registered, _reduce_registered)
    try:
        assert _subclasses.reducer_for(Registered) is None
        assert round_trip(Registered(a=1)) == {"via": "copyreg"}
    finally:
        del copyreg.dispatch_table[Registered]
    assert round_trip([MISSING])[0] is MISSING  # a sentinel stays the module's object
    with pytest.raises(tcc.CaptureError, match=r"Symbol.__new__ requires arguments that pickling does not pass"):
        tcc.dumps(Symbol("a"))
