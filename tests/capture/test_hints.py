"""Capture failures whose fix is known say so: live clients and locks go in tcc.resource.

Also: a comprehension's hidden iterator ``.0`` is named for what it is.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import inspect
import json
import os
import socket
import sqlite3
import subprocess
import sys
import textwrap
import threading
import weakref
from typing import Any

import pytest

import tcc
from tests._support import programs

RESOURCE = 'tcc.resource(factory, ...), which is captured as "call the factory again"'


def suspended(coro: Any) -> Any:
    coro.send(None)
    return coro


async def holds(obj: object) -> None:
    value = obj
    await programs.call("x", 1)
    del value


def capture_error(task: Any) -> str:
    """The message of the CaptureError that ``tcc.dumps(task)`` raises; closes ``task``."""
    try:
        with pytest.raises(tcc.CaptureError) as info:
            tcc.dumps(task)
    finally:
        task.close()
    return str(info.value)


def httpx_module() -> Any:
    """httpx, or the fork openai depends on here (httpx2); skip if neither is installed."""
    for name in ("httpx", "httpx2"):
        try:
            return importlib.import_module(name)
        except ImportError:
            pass
    pytest.skip("neither httpx nor httpx2 is installed")


def make_openai(async_: bool) -> Any:
    openai = pytest.importorskip("openai")
    cls = openai.AsyncOpenAI if async_ else openai.OpenAI
    return cls(api_key="sk-test", base_url="http://127.0.0.1:9/v1", max_retries=0)


@pytest.mark.parametrize(
    "make, example",
    [
        (lambda tmp: threading.Lock(), "obj = tcc.resource(threading.Lock)"),
        (lambda tmp: threading.RLock(), "obj = tcc.resource(threading.RLock)"),
        (lambda tmp: threading.Condition(), "obj = tcc.resource(threading.Condition)"),
        (lambda tmp: threading.Semaphore(2), "obj = tcc.resource(threading.Semaphore, ...)"),
        (lambda tmp: sqlite3.connect(":memory:"), "obj = tcc.resource(sqlite3.connect, ...)"),
        (lambda tmp: socket.socket(), "obj = tcc.resource(socket.create_connection, ...)"),
        (lambda tmp: open(tmp / "notes.txt", "a"), "obj = tcc.resource(open, ...)"),
        (lambda tmp: make_openai(False), "obj = tcc.resource(openai.OpenAI, ...)"),
        (lambda tmp: make_openai(True), "obj = tcc.resource(openai.AsyncOpenAI, ...)"),
    ],
    ids=["lock", "rlock", "condition", "semaphore", "sqlite3", "socket", "file", "openai",
         "async-openai"],
)
def test_live_object_in_a_local_gets_a_resource_hint(make, example, tmp_path):
    """A lock, connection, socket, file or API client in a local ends the message with the fix."""
    obj = make(tmp_path)
    try:
        message = capture_error(suspended(holds(obj)))
    finally:
        close = getattr(obj, "close", None)
        if close is not None and not inspect.iscoroutinefunction(close):
            close()
    assert "holds() line" in message and "local 'obj'" in message
    assert "; hint: " in message and RESOURCE in message
    assert message.endswith(example), message


@pytest.mark.parametrize("make", [hashlib.sha256, hashlib.md5, hashlib.blake2b, hashlib.sha3_256,
                                  hashlib.shake_128], ids=lambda f: f.__name__)
def test_running_hash_in_a_local_is_hinted_to_keep_its_data_not_a_resource(make):
    """A hashlib object held across an effect cannot be saved, and tcc.resource would give a
    fresh, empty hash on resume: the hint says to keep the data (or digests) instead."""
    h = make(b"so far")
    message = capture_error(suspended(holds(h)))
    assert "local 'obj'" in message and "; hint: " in message
    assert "hashlib hash object (obj) cannot be saved mid-computation" in message
    assert "keep the data it hashes" in message and RESOURCE not in message


@pytest.mark.parametrize("async_", [False, True], ids=["Client", "AsyncClient"])
def test_httpx_client_in_a_local_is_hinted(async_):
    """An httpx client fails on a lock deep inside it; the hint names the client, not the lock."""
    httpx = httpx_module()
    cls = httpx.AsyncClient if async_ else httpx.Client
    client = cls(timeout=30)
    try:
        message = capture_error(suspended(holds(client)))
    finally:
        if not async_:
            client.close()
    assert "local 'obj' -> " in message and "cannot pickle '_thread.RLock' object" in message
    assert f"; hint: keep the live client ({httpx.__name__}.{cls.__name__}) in " in message
    assert message.endswith(f"obj = tcc.resource({httpx.__name__}.{cls.__name__}, ...)"), message


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


def test_lock_deep_inside_an_own_object_names_the_object_that_holds_it():
    """A lock deep inside the local's own object suggests keeping that object in tcc.resource."""
    message = capture_error(suspended(holds_client("q")))
    assert ("local 'client' -> _transport -> _pool -> _lock: "
            "cannot pickle '_thread.RLock' object") in message
    assert "; hint: keep the Client that holds a lock (threading.RLock) in " in message
    assert message.endswith(RESOURCE + ", e.g. client = tcc.resource(Client, ...)"), message


class AgentState:
    def __init__(self) -> None:
        self.history: list[str] = ["hello"]
        self.llm = make_openai(False)


def test_client_inside_a_state_object_is_named_where_it_is():
    """An API client kept in an attribute of a state object is what the hint says to wrap."""
    message = capture_error(suspended(holds(AgentState())))
    assert "local 'obj' -> llm -> _client -> " in message
    assert "; hint: keep the live client (openai.OpenAI) in " + RESOURCE in message
    assert message.endswith("llm = tcc.resource(openai.OpenAI, ...)"), message


def test_asyncio_lock_with_a_waiter_is_hinted():
    """An asyncio.Lock that a task waits on is refused with the hint to make it a tcc.resource."""

    async def scenario() -> str:
        lock = asyncio.Lock()
        await lock.acquire()
        waiter = asyncio.ensure_future(lock.acquire())
        await asyncio.sleep(0)  # the waiter now sits in lock._waiters
        try:
            return capture_error(suspended(holds(lock)))
        finally:
            waiter.cancel()
            lock.release()

    message = asyncio.run(scenario())
    assert "local 'obj' -> " in message
    assert "; hint: keep the lock (asyncio.Lock) in " in message
    assert message.endswith("obj = tcc.resource(asyncio.Lock)"), message


OPENED: list[Any] = []


def open_tracked(path: str) -> Any:
    f = open(path)
    OPENED.append(f)
    return f


async def reads_lines(path: str) -> list[str]:
    lines = (line.strip() for line in open_tracked(path))
    first = next(lines)
    await programs.call("x", first)
    return [first, *lines]


def test_generator_expression_iterator_is_named_and_an_open_file_in_it_hinted(tmp_path):
    """A generator expression's '.0' is named as its iterator and line; the file in it is hinted."""
    path = tmp_path / "in.txt"
    path.write_text("a\nb\n")
    task = suspended(reads_lines(str(path)))
    genexpr_line = reads_lines.__code__.co_firstlineno + 1
    try:
        message = capture_error(task)
    finally:
        while OPENED:
            OPENED.pop().close()
    assert "'.0'" not in message
    assert f"<genexpr>() line {genexpr_line} " in message
    assert (f": the iterator of the generator expression at line {genexpr_line}: "
            "open files cannot") in message
    assert message.endswith("f = tcc.resource(open, ...)"), message


class Node:
    pass


NODE = Node()


def two_refs() -> list[Any]:
    return [[NODE], weakref.ref(NODE)]


async def counts_live() -> int:
    live = (x is not None for x in two_refs())
    first = next(live)
    await programs.call("x", first)
    return first + sum(live)


def test_unrelated_failure_inside_a_generator_expression_gets_no_hint():
    """A value with no known fix is reported via a generator expression's iterator, unhinted."""
    task = suspended(counts_live())
    line = counts_live.__code__.co_firstlineno + 1
    message = capture_error(task)
    assert f"the iterator of the generator expression at line {line} -> " in message, message
    assert "cannot pickle 'weakref.ReferenceType' object" in message
    assert "; hint:" not in message and "tcc.resource" not in message


def bytes_and_lock() -> list[Any]:
    return [b"ab", threading.Lock()]


async def await_in_comprehension() -> list[Any]:
    return [await programs.call("x", len(x)) for x in bytes_and_lock()]


@pytest.mark.skipif(sys.version_info >= (3, 12),
                    reason="3.12 inlines comprehensions (PEP 709): no '.0'")
def test_list_comprehension_iterator_is_named():
    """The '.0' of an awaiting list comprehension (a coroutine on 3.11) is named as its iterator."""
    task = suspended(await_in_comprehension())
    line = await_in_comprehension.__code__.co_firstlineno + 1
    message = capture_error(task)
    assert f"the iterator of the list comprehension at line {line} -> " in message, message
    assert "'.0'" not in message and "; hint: keep the lock (threading.Lock) in " in message


AGENT = '''
import threading

import openai

import tcc


@tcc.effect
def ask(client, prompt):
    return prompt


@tcc.effect
def guarded(n, *, guard):
    return n


async def with_client():
    return await ask(openai.OpenAI(api_key="sk-test", base_url="http://127.0.0.1:9/v1"), "hi")


async def with_lock():
    return await guarded(1, guard=threading.Lock())
'''


def tcc_cli(tmp_path: Any, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, TCC_STORE=str(tmp_path / "store"))
    return subprocess.run([sys.executable, "-m", "tcc", *args], env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize(
    "func, effect, example",
    [
        ("with_client", "ask", "client = tcc.resource(openai.OpenAI, ...)"),
        ("with_lock", "guarded", "guard = tcc.resource(threading.Lock)"),
    ],
)
def test_effect_argument_failure_of_a_real_run_carries_the_hint(tmp_path, func, effect, example):
    """A run calling an effect with a client or lock fails with the hint, on stderr and in show."""
    pytest.importorskip("openai")
    script = tmp_path / "agent.py"
    script.write_text(textwrap.dedent(AGENT))
    proc = tcc_cli(tmp_path, "run", "--run-id", "r1", f"{script}:{func}")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f":{effect}' cannot be journaled: cannot capture object: " in proc.stderr, proc.stderr
    assert RESOURCE in proc.stderr and example in proc.stderr, proc.stderr
    shown = json.loads(tcc_cli(tmp_path, "show", "--json", "r1").stdout)
    assert shown["status"] == "failed"
    assert example in shown["error"]
