"""Capture failures are refused loudly and name the frame and variable path."""

from __future__ import annotations

import asyncio
import socket
import threading

import pytest

import tcc
from tcc import errors
from tests._support import programs


class Pool:
    def __init__(self) -> None:
        self._lock = threading.RLock()


class Transport:
    def __init__(self) -> None:
        self._pool = Pool()


class Client:
    def __init__(self) -> None:
        self._transport = Transport()


async def holds_client(query: str) -> str:
    client = Client()
    answer = await programs.call("llm", query)
    return f"{answer}{client}"


async def holds(obj: object) -> None:
    value = obj
    await programs.call("x", 1)
    del value


def suspended(coro):
    coro.send(None)
    return coro


def test_error_names_function_line_and_attribute_path():
    """A lock deep inside a local is reported as frame, line, local and attribute path."""
    task = suspended(holds_client("q"))
    with pytest.raises(tcc.CaptureError) as info:
        tcc.dumps(task)
    message = str(info.value)
    assert message.startswith("cannot capture holds_client() line 33 (")
    assert "test_errors.py:33" in message
    assert "local 'client' -> _transport -> _pool -> _lock: cannot pickle '_thread.RLock'" in message
    task.close()


def test_error_names_the_inner_frame_of_an_await_chain():
    """The message starts at the innermost frame that holds the culprit."""

    async def outer():
        return await holds_client("q")

    task = suspended(outer())
    with pytest.raises(tcc.CaptureError, match=r"holds_client\(\) line 33 .*local 'client'"):
        tcc.dumps(task)
    task.close()


def test_capture_error_is_a_type_error_and_a_tcc_error():
    """CaptureError can be caught as TccError or as TypeError."""
    assert issubclass(errors.CaptureError, errors.TccError)
    assert issubclass(errors.CaptureError, TypeError)


@pytest.mark.parametrize(
    "make, needle",
    [
        (lambda tmp: open(tmp / "f.txt", "w"), "open files cannot be captured"),
        (lambda tmp: open(tmp / "f.bin", "wb"), "open files cannot be captured"),
        (lambda tmp: socket.socket(), "sockets cannot be captured"),
        (lambda tmp: threading.Lock(), "cannot pickle '_thread.lock'"),
    ],
    ids=["text-file", "binary-file", "socket", "lock"],
)
def test_unsafe_resources_are_refused_not_replaced(make, needle, tmp_path):
    """Files, sockets and locks in a local are refused with a clear reason."""
    resource = make(tmp_path)
    try:
        task = suspended(holds(resource))
        with pytest.raises(tcc.CaptureError, match=needle) as info:
            tcc.dumps(task)
        assert "holds() line 39" in str(info.value) and "local 'obj'" in str(info.value)
        task.close()
    finally:
        close = getattr(resource, "close", None)
        if close is not None:
            close()


def test_asyncio_future_and_task_are_refused():
    """asyncio futures and tasks in a local cannot be captured."""

    async def scenario():
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        bg = asyncio.ensure_future(asyncio.sleep(0))
        for obj in (fut, bg):
            task = suspended(holds(obj))
            with pytest.raises(tcc.CaptureError, match="asyncio futures and tasks"):
                tcc.dumps(task)
            task.close()
        await bg
        fut.cancel()

    asyncio.run(scenario())


def test_running_coroutine_is_refused():
    """A coroutine cannot capture itself while it runs."""
    seen = []

    async def selfish():
        seen.append(pytest.raises(tcc.CaptureError, match="is running"))
        with seen[0]:
            tcc.dumps(me[0])
        return "ok"

    me = [selfish()]
    with pytest.raises(StopIteration):
        me[0].send(None)
    assert seen[0].excinfo is not None


def test_async_generator_is_refused():
    """Async generators are refused with a pointer to the alternative."""

    async def agen():
        yield 1

    ag = agen()
    with pytest.raises(tcc.CaptureError, match="async generators cannot be captured"):
        tcc.dumps([ag])


def test_registered_reducer_rebuilds_a_refused_object():
    """register_reducer lets a user say how to rebuild an object tcc would refuse."""

    class Conn:
        def __init__(self, dsn: str) -> None:
            self.dsn = dsn
            self.lock = threading.Lock()

    tcc.register_reducer(Conn, lambda c: (Conn, (c.dsn,)))
    task = suspended(holds(Conn("db://x")))
    restored = tcc.loads(tcc.dumps(task))
    conn = restored.cr_frame.f_locals["value"]
    assert isinstance(conn, Conn) and conn.dsn == "db://x"
    assert conn.lock.acquire(blocking=False)
    task.close()
    restored.close()


@pytest.mark.parametrize("cls, reducer, needle", [
    ("not a class", lambda o: (str, ()), "needs a class"),
    (threading.Thread, "not callable", "needs a function taking the object"),
    (threading.Thread, None, "needs a function taking the object"),
])
def test_register_reducer_refuses_misuse_at_once(cls, reducer, needle):
    """A reducer that is not callable (or a non-class) is refused when it is registered, not at
    some later capture far from the mistake."""
    with pytest.raises(TypeError, match=needle):
        tcc.register_reducer(cls, reducer)
