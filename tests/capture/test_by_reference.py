"""The pickler's fast paths: its test for "pickle this function or class by reference"
(``tcc.capture._pickler._by_reference``) gives cloudpickle's answer on every kind of
function and class, and what it decides still loads back to the same object; and its
dispatch table, which still holds copyreg's and cloudpickle's reducers."""

from __future__ import annotations

import collections
import functools
import json
import pickle
import sys
import types

import cloudpickle
import pytest

from tcc.capture import _pickler, dumps, loads


def top_level():
    return 1


class TopLevel:
    def method(self):
        return 2

    class Inner:
        pass


def _nested():
    def inner():
        return 3

    return inner


def _cases():
    module = types.ModuleType("tcc_test_dynamic")  # not in sys.modules
    exec("def f():\n    return 4\nclass C:\n    pass\n", module.__dict__)
    rebound = types.FunctionType(top_level.__code__, globals(), "top_level")  # a lookalike
    return [
        top_level, TopLevel, TopLevel.Inner, TopLevel.method, _nested(), lambda: 5,
        json.dumps, json.JSONDecoder, collections.OrderedDict, functools.partial, int, type(None),
        types.FunctionType, type(Ellipsis), module.f, module.C, rebound,
    ]


@pytest.mark.parametrize("obj", _cases(), ids=lambda o: getattr(o, "__qualname__", repr(o)))
def test_the_fast_test_gives_cloudpickles_answer(obj):
    assert _pickler._by_reference(obj) == bool(cloudpickle.cloudpickle._should_pickle_by_reference(obj))


def test_a_module_registered_by_value_is_left_to_cloudpickle():
    module = sys.modules[__name__]
    assert _pickler._by_reference(top_level)
    cloudpickle.register_pickle_by_value(module)
    try:
        assert not _pickler._by_reference(top_level)
        assert not cloudpickle.cloudpickle._should_pickle_by_reference(top_level)
    finally:
        cloudpickle.unregister_pickle_by_value(module)
    assert _pickler._by_reference(top_level)


def test_a_name_rebound_to_another_object_is_not_taken_for_it():
    global top_level
    original = top_level
    try:
        top_level = _nested()  # the module's name now holds another function
        assert not _pickler._by_reference(original)
        restored = loads(dumps(original))  # by value: it still runs the original code
        assert restored() == 1 and restored is not original
    finally:
        top_level = original


def test_functions_and_classes_by_reference_load_as_themselves():
    for obj in (top_level, TopLevel, TopLevel.Inner, json.dumps, collections.OrderedDict, type(None),
                types.FunctionType):
        assert loads(dumps(obj)) is obj
    assert pickle.loads(pickle.dumps(TopLevel)) is TopLevel


class _Registered:
    def __init__(self, value):
        self.value = value


def _rebuild(value):
    return _Registered(value + 1)


def test_the_pickler_sees_copyreg_and_cloudpickle_reducers():
    """Its dispatch table is one dict made per pickler (not cloudpickle's ChainMap): a
    reducer registered with copyreg since is used, and cloudpickle's own still apply."""
    import copyreg

    assert _pickler._FLAT_TABLE  # this cloudpickle's table is the one the dict stands for

    copyreg.pickle(_Registered, lambda obj: (_rebuild, (obj.value,)))
    try:
        assert loads(dumps(_Registered(1))).value == 2
    finally:
        del copyreg.dispatch_table[_Registered]
    assert loads(dumps(_Registered(1))).value == 1  # by its class again
    proxy = types.MappingProxyType({"a": 1})
    assert dict(loads(dumps(proxy))) == {"a": 1}  # cloudpickle's reducer: pickle refuses it
    with pytest.raises(TypeError):
        pickle.dumps(proxy)
