"""Agents for the effect review regressions: names, timeouts, methods (FUNC selects one)."""

import asyncio
import os
import threading
import time

import tcc


def note(line):
    """Append a timestamped line to $LEDGER (read at call time: tests set it per run)."""
    with open(os.environ["LEDGER"], "a") as fh:
        fh.write(f"{time.time():.6f} {line}\n")


# ------------------------------------------------------------------ names


def make_tool(label):
    @tcc.effect(name=f"review-tool-{label}")
    def tool(x):
        return f"{label}({x})"

    return tool


upper = make_tool("UPPER")
lower = make_tool("lower")


async def named_tools():
    return [await upper("a"), await lower("b")]


async def tools_across_approval():
    u, l = upper, lower  # effects held in locals are captured by name
    first = await u("a")
    ok = await tcc.approval("go on?")
    return [first, ok, await l("b"), await u("c")]


# --------------------------------------------------------------- timeouts


@tcc.effect(retries=1, timeout=0.2)
def slow(x):
    attempt = tcc.current().attempt
    note(f"start {attempt}")
    time.sleep(0.8)
    note(f"end {attempt}")
    return x


async def sync_timeout():
    try:
        return await slow(1)
    except TimeoutError as exc:
        return f"caught: {exc}"


@tcc.effect(timeout=0.2)
def slow_once(x):
    note(f"start {x}")
    time.sleep(0.6)
    note(f"end {x}")
    return x


async def call_again_after_timeout():
    caught = []
    for x in ("first", "second"):
        try:
            await slow_once(x)
        except TimeoutError:
            caught.append(x)
    return caught


@tcc.effect(timeout=0.2)
async def async_slow():
    await asyncio.sleep(30)


@tcc.effect(timeout=5)
async def async_own_timeout():
    raise TimeoutError("the service said: too slow")


async def async_timeouts():
    messages = []
    for eff in (async_slow, async_own_timeout):
        try:
            await eff()
        except TimeoutError as exc:
            messages.append(str(exc))
    return messages


# ---------------------------------------------------------------- methods


class Svc:
    def __init__(self, n):
        self.n = n

    @tcc.effect
    def method(self, x):
        return f"{x}*{self.n}"

    @tcc.effect
    async def amethod(self, x):
        return f"async {x}*{self.n}"

    @staticmethod
    @tcc.effect
    def static_above(x):
        return f"static {x}"

    @tcc.effect
    @staticmethod
    def static_below(x):
        return f"static {x}"

    @classmethod
    @tcc.effect
    def class_above(cls, x):
        return f"{cls.__name__} {x}"

    @tcc.effect
    @classmethod
    def class_below(cls, x):
        return f"{cls.__name__} {x}"


async def methods():
    svc = Svc(3)
    return [
        await svc.method("m"),
        await svc.amethod("a"),
        await Svc.method(svc, "unbound"),
        await svc.static_above("s"),
        await Svc.static_below("s"),
        await svc.class_above("c"),
        await Svc.class_below("c"),
    ]


async def method_across_approval():
    bound = Svc(4).method  # a bound effect in a local, captured in the snapshot
    ok = await tcc.approval("go on?")
    return [ok, await bound("x")]


class Locked:
    def __init__(self):
        self.lock = threading.Lock()

    @tcc.effect
    def method(self, x):
        return x


async def uncapturable_self():
    return await Locked().method("m")
