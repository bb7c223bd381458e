"""Agents that wait for signals, approvals and timers (FUNC selects one)."""

import os

import tcc

LEDGER = os.environ.get("LEDGER")


@tcc.effect
def act(what):
    if os.environ.get("DIE_AT") == what:
        os.kill(os.getpid(), 9)
    if LEDGER:
        with open(LEDGER, "a") as fh:
            fh.write(f"{tcc.current().idempotency_key} {what}\n")
    return f"did {what}"


def _asked(intent):
    """A verify probe that only notes that it was asked (and finds nothing)."""
    if LEDGER:
        with open(LEDGER, "a") as fh:
            fh.write(f"probe {intent.idempotency_key}\n")
    return None


def _checked(what):
    if os.environ.get("DIE_AT") == what:
        os.kill(os.getpid(), 9)
    return f"did {what}"


probed = tcc.effect(_checked, name="wait_agent:probed", verify=_asked)


async def gated_checked():
    """An approval, then two calls of an effect with a verify probe."""
    ok = await tcc.approval("Go?")
    return [ok, await probed("first"), await probed("second")]


async def gated():
    before = await act("prepare")
    ok = await tcc.approval("Deploy to prod?")
    after = await act("deploy" if ok else "rollback")
    return [before, ok, after]


async def two_signals():
    first = await tcc.wait_for("alpha")
    second = await tcc.wait_for("beta")
    again = await tcc.wait_for("alpha")
    return [first, second, again, await act("done")]


async def timed_out():
    try:
        return await tcc.wait_for("never", timeout=0.3)
    except TimeoutError as exc:
        return f"timed out: {exc}"


async def sleeper(seconds="1.0"):
    await act("before")
    await tcc.sleep(float(seconds))
    return await act("after")


async def forkable():
    answer = await act("question")
    await tcc.checkpoint()
    extra = await act(f"follow-up to {answer}")
    return [answer, extra]


async def slow_steps(n="6"):
    import time as _t

    done = []
    for i in range(int(n)):
        _t.sleep(float(os.environ.get("STEP_DELAY", "0")))
        done.append(await act(f"step {i}"))
    return done


def sync_main(n="4"):
    """A plain function: effects switch to the driver through a greenlet."""
    out = [act(f"sync {i}") for i in range(int(n))]
    if os.environ.get("SYNC_DIE") == "1" and not os.environ.get("SYNC_RESUMED"):
        os.kill(os.getpid(), 9)
    out.append(act("after"))
    return out


async def child_task(label, steps):
    got = []
    for i in range(steps):
        got.append(await act(f"{label} {i}"))
    return got


async def parent():
    first = await act("parent start")
    kids = await tcc.spawn(child_task, "kid", 3)
    return [first, kids, await act("parent end")]


async def checked(value="ok"):
    return await act(value)


async def verify(result):
    if "bad" in result:
        raise AssertionError(f"result {result!r} failed the check")
    return True


async def gated_child(n):
    ok = await tcc.approval(f"child {n}?")
    return await act(f"child {n} {ok}")


async def parent_of_gated():
    kid = await tcc.spawn(gated_child, "3")
    return [kid, await act("parent end")]


async def spawns_badly():
    try:
        await tcc.spawn(child_task, "kid", 3, "one too many")
    except TypeError as exc:
        return ["refused", str(exc)]
    return ["spawned"]


async def parent_of_slow():
    kids = await tcc.spawn(slow_steps, "6")
    return ["parent", kids]
