"""Namespaces a snapshot names instead of copying: a module's globals() and os.environ (not
``__main__``'s, which is another program in the loading process); weak proxies are refused."""

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
        blob = tcc.dumps([os.environ, os.environb])
        back = tcc.loads(blob)
        assert b"s3cr3t-value-91" not in blob and back[0] is os.environ and back[1] is os.environb
    finally:
        del os.environ["TCC_TEST_NAMESPACE_SECRET"]


def test_the_main_modules_namespace_is_copied_as_before() -> None:
    """`__main__` in the loading process is another program (the tcc CLI, a test runner):
    its globals() are copied, not named."""
    from tcc.capture._segments import namespace_pid

    main = vars(sys.modules["__main__"])

    assert namespace_pid(main) is None and namespace_pid(vars(sys.modules[__name__])) is not None


def test_a_weak_proxy_is_refused_naming_it() -> None:
    class Box:
        pass

    box = Box()
    with pytest.raises(tcc.CaptureError, match=r"weak proxies \(weakref.proxy\) cannot be captured"):
        tcc.dumps({"w": weakref.proxy(box)})
