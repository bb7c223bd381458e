"""Namespaces a snapshot names instead of copying: a module's globals(), os.environ, and the
namespace an exec()'d function shares with the code that made it; weak proxies are refused."""

from __future__ import annotations

import os
import sys
import weakref

import pytest

import tcc


def test_a_module_namespace_is_stored_by_name() -> None:
    this = vars(sys.modules[__name__])
    back = tcc.loads(tcc.dumps({"g": this, "again": this}))
    assert back["g"] is this and back["again"] is this


def test_os_environ_is_the_live_environment_and_not_in_the_bytes() -> None:
    os.environ["TCC_TEST_NAMESPACE_SECRET"] = "s3cr3t-value-91"
    try:
        blob = tcc.dumps([os.environ])
        assert b"s3cr3t-value-91" not in blob and tcc.loads(blob)[0] is os.environ
    finally:
        del os.environ["TCC_TEST_NAMESPACE_SECRET"]


def test_an_exec_namespace_stays_shared_with_its_functions() -> None:
    ns: dict = {}
    exec("CALLS = 0\ndef tool(x):\n    global CALLS\n    CALLS += 1\n    return x * 2\n", ns)
    ns["tool"](1)
    back_ns, back_tool = tcc.loads(tcc.dumps((ns, ns["tool"])))
    assert back_tool.__globals__ is back_ns and back_ns["CALLS"] == 1
    assert back_tool(5) == 10 and back_ns["CALLS"] == 2  # writes reach the namespace the agent holds
    alone = tcc.loads(tcc.dumps(ns["tool"]))  # the function alone carries its namespace
    alone(1)
    assert alone.__globals__["CALLS"] == 2 and ns["CALLS"] == 1


def test_a_weak_proxy_is_refused_naming_it() -> None:
    class Box:
        pass

    box = Box()
    with pytest.raises(tcc.CaptureError, match=r"weak proxies \(weakref.proxy\) cannot be captured"):
        tcc.dumps({"w": weakref.proxy(box)})
