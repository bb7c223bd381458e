"""Agent-like programs used by the capture tests.

Each program is an ``async def`` (or a generator) that talks to its driver
only through :class:`Req` objects it awaits/yields; the driver answers each
request with :func:`answer`, a pure function of the request, so a run is
fully determined by where it is suspended.  This module is imported by name
in child processes, so its functions are pickled by reference.
"""

from __future__ import annotations

import sys
from typing import Any, Callable


class Req:
    """A request the driver must answer (stands in for an effect)."""

    def __init__(self, kind: str, arg: Any) -> None:
        self.kind = kind
        self.arg = arg

    def __await__(self) -> Any:
        return (yield self)

    def __repr__(self) -> str:
        return f"Req({self.kind!r}, {self.arg!r})"


def answer(req: Req) -> Any:
    """The deterministic reply to a request."""
    if req.kind == "num":
        return len(repr(req.arg)) % 7
    if req.kind == "fail":
        return KeyError(req.arg)
    return f"{req.kind}<{req.arg}>"


def drive(task: Any, *, first: Any = None, limit: int | None = None) -> tuple[list[str], Any]:
    """Run ``task`` to the end (or ``limit`` requests); return (trace, result).

    A reply that is an exception is thrown into the task instead of sent.
    """
    trace: list[str] = []
    value: Any = first
    try:
        while limit is None or len(trace) < limit:
            if isinstance(value, BaseException):
                req = task.throw(value)
            else:
                req = task.send(value)
            trace.append(repr(req))
            value = answer(req)
        return trace, "<suspended>"
    except StopIteration as stop:
        return trace, repr(stop.value)


def advance(task: Any, steps: int) -> Any:
    """Run ``task`` until it has issued ``steps`` requests; return the pending reply."""
    value: Any = None
    for _ in range(steps):
        req = task.throw(value) if isinstance(value, BaseException) else task.send(value)
        value = answer(req)
    return value


# ------------------------------------------------------------------ helpers


async def call(kind: str, arg: Any) -> Any:
    return await Req(kind, arg)


async def nested(depth: int, arg: Any) -> Any:
    if depth == 0:
        first = await call("leaf", arg)
        return await call("leaf-again", first)
    return f"[{await nested(depth - 1, arg)}]"


def gen_source(n: int) -> Any:
    for i in range(n):
        got = yield Req("gen", i)
        yield Req("echo", got)
    return "gen-done"


def delegating(n: int) -> Any:
    total = yield from gen_source(n)
    extra = yield from (Req("inner", x) for x in "ab")
    return (total, extra)


class Counter:
    """Class-based async iterator: awaits inside __anext__."""

    def __init__(self, n: int) -> None:
        self.i = 0
        self.n = n

    def __aiter__(self) -> "Counter":
        return self

    async def __anext__(self) -> Any:
        if self.i >= self.n:
            raise StopAsyncIteration
        self.i += 1
        return await call("next", self.i)


class Session:
    """Class-based async context manager that records its lifecycle."""

    def __init__(self, log: list[str]) -> None:
        self.log = log

    async def __aenter__(self) -> "Session":
        self.log.append(await call("open", len(self.log)))
        return self

    async def __aexit__(self, *exc: Any) -> bool:
        self.log.append(await call("close", exc[0].__name__ if exc[0] else None))
        return False


class SyncBlock:
    """A picklable synchronous context manager."""

    def __init__(self, log: list[str]) -> None:
        self.log = log

    def __enter__(self) -> "SyncBlock":
        self.log.append("enter")
        return self

    def __exit__(self, *exc: Any) -> None:
        self.log.append(f"exit:{exc[0].__name__ if exc[0] else None}")


class Planner:
    """Coroutine methods keep `self` in a local."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.steps: list[Any] = []

    async def step(self, i: int) -> Any:
        got = await call("plan", f"{self.topic}-{i}")
        self.steps.append(got)
        return got

    async def run(self, n: int) -> Any:
        for i in range(n):
            await self.step(i)
        return self.steps


def combine(*parts: Any) -> str:
    return "|".join(map(str, parts))


# ----------------------------------------------------------------- programs


async def research_agent(topic: str) -> Any:
    """A loop over several iterator kinds with try/except/finally inside."""
    notes: list[Any] = []
    queries = await call("plan", topic)
    seen = {"a": 1, "b": 2, "c": 3}
    for i, q in enumerate(["x", "y"]):
        notes.append((i, await call("search", f"{queries}:{q}")))
    for key in seen:
        notes.append(await call("num", key))
    for a, b in zip((1, 2), reversed(range(5))):
        notes.append(a * b + await call("num", a))
    for word in ("tuple", "iter"):
        try:
            notes.append(await call("fail", word))
        except KeyError as exc:
            notes.append(("recovered", str(exc), await call("after-error", word)))
        finally:
            notes.append(await call("finally", word))
    return notes


async def half_evaluated(seed: int) -> Any:
    """Suspensions in the middle of expressions."""
    planner = Planner(str(seed))
    a = combine(seed, await call("mid", 1), seed + 1)
    b = [seed, await call("list", 2), *[await call("star", k) for k in range(2)]]
    c = {"k": await call("dict", 3), await call("key", 4): seed}
    planner.steps.append(await call("method-arg", 5))
    d = planner.topic.join([str(await call("join", 6)), "z"])
    e = seed + await call("num", 7) * (await call("num", 8) - 1)
    return a, b, c, planner.steps, d, e


async def closures(n: int) -> Any:
    """A nested function shares a cell with the suspended frame."""
    count = 0
    box: list[int] = []

    def bump(by: int) -> int:
        nonlocal count
        count += by
        return count

    for i in range(n):
        bump(await call("num", i))
        box.append(count)
    return count, box, bump(100), count


async def contexts(tag: str) -> Any:
    """async with, async for and sync with, all holding awaits."""
    log: list[str] = []
    async with Session(log) as session:
        async for item in Counter(3):
            log.append(item)
            with SyncBlock(log):
                log.append(await call("inside", item))
        log.append(await call("body", f"{tag}:{session.__class__.__name__}"))
    try:
        async with Session(log):
            await call("fail-inside", tag)
            raise ValueError(tag)
    except ValueError as exc:
        log.append(f"caught:{exc}")
    return log


async def exception_state(tag: str) -> Any:
    """Bare `raise` after a suspension inside `except` needs gi_exc_state."""
    out: list[Any] = []
    try:
        try:
            raise KeyError(tag)
        except KeyError as exc:
            out.append(await call("in-except", tag))
            out.append(repr(exc))
            try:
                raise RuntimeError("inner") from exc
            except RuntimeError as inner:
                out.append(await call("in-inner", repr(inner.__cause__)))
            raise
    except KeyError as again:
        out.append(("reraised", repr(again), repr(again.__context__)))
    return out


async def deep(depth: int) -> Any:
    """A long await chain (recursion)."""
    start = await call("start", depth)
    got = await nested(depth, "bottom")
    return start, len(got), await call("end", got[-9:])


async def generators_inside(n: int) -> Any:
    """Plain generators and generator expressions held in locals."""
    squares = (x * x for x in range(n))
    first = next(squares)
    evens = iter([x for x in range(10) if x % 2 == 0])
    got = [first, await call("g", next(squares))]
    got.append(await call("num", next(evens)))
    got.extend(squares)
    return got, list(evens)


async def methods(topic: str) -> Any:
    return await Planner(topic).run(3)


async def shared_objects(n: int) -> Any:
    """The same list is referenced by two frames."""
    data: list[Any] = []
    await fill(data, n)
    return data, len(data)


async def fill(data: list[Any], n: int) -> None:
    for i in range(n):
        data.append(await call("fill", i))


def generator_program(n: int) -> Any:
    """A plain generator program (driven with send)."""
    result = yield from delegating(n)
    total = 0
    for item in [1, 2, 3]:
        total += (yield Req("sum", item)) is not None
    return result, total


async def with_cleanup(tag: str) -> Any:
    """Used by throw()/close() tests: state visible through a module list."""
    try:
        await call("work", tag)
        await call("more", tag)
    except KeyError as exc:
        CLEANUP_LOG.append(f"except:{exc}")
        return await call("handled", tag)
    finally:
        CLEANUP_LOG.append(f"finally:{tag}")
    return "normal"


CLEANUP_LOG: list[str] = []


class Box:
    """Holds a reference back to the task that holds the box (a cycle)."""

    task: Any = None


async def self_referential(box: Box) -> Any:
    """A coroutine reachable from its own locals: the cycle must survive."""
    out = []
    for i in range(3):
        out.append(await call("cycle", i))
        out.append(box.task.cr_frame is sys._getframe())
    return out


def make_self_referential() -> Any:
    box = Box()
    box.task = self_referential(box)
    return box.task


PROGRAMS: dict[str, Callable[[], Any]] = {
    "research_agent": lambda: research_agent("llm"),
    "half_evaluated": lambda: half_evaluated(3),
    "closures": lambda: closures(4),
    "contexts": lambda: contexts("t"),
    "exception_state": lambda: exception_state("E"),
    "deep": lambda: deep(210),
    "generators_inside": lambda: generators_inside(5),
    "methods": lambda: methods("m"),
    "shared_objects": lambda: shared_objects(3),
    "generator_program": lambda: generator_program(2),
    "with_cleanup": lambda: with_cleanup("c"),
    "self_referential": make_self_referential,
}
