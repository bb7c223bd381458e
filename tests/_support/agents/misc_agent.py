"""Small agents for CLI behaviour tests (selected by FUNC in SCRIPT:FUNC)."""

import os
import threading

import tcc

MARK = os.environ.get("MARK")
if __name__ == "__main__" and MARK:  # must not run under tcc run / resume
    open(MARK, "w").write("main block ran")


@tcc.effect
def echo(value):
    return value


@tcc.effect
async def slow_echo(value):
    import asyncio

    await asyncio.sleep(float(os.environ.get("SLOW", "0.05")))
    return value


@tcc.effect(retries=2)
def flaky(path):
    """Fails on the first two attempts (counted in a file), then succeeds."""
    n = int(open(path).read()) if os.path.exists(path) else 0
    open(path, "w").write(str(n + 1))
    if n < 2:
        raise ConnectionError(f"attempt {n + 1} failed")
    return n + 1


async def ok(x="1"):
    a = await echo(int(x))
    b = await echo(a + 1)
    return [a, b, tcc.current().run_id is not None]


async def boom():
    await echo(1)
    raise ValueError("agent gave up")


async def holds_lock():
    await echo(1)
    guard = threading.Lock()
    await echo(2)
    return str(guard)


def make_lock():
    return threading.Lock()


async def with_resource():
    lock = tcc.resource(make_lock)
    with lock:
        await echo(1)
    return await echo(lock.locked())


async def concurrent():
    values = await tcc.gather(slow_echo(1), slow_echo(2), slow_echo(3))
    return values


async def retrying(path):
    return await flaky(path)


@tcc.effect(retries=1)
def always_fails():
    raise ConnectionError("service down")


async def catches():
    try:
        await always_fails()
    except ConnectionError as exc:
        return f"caught {exc}"


async def awaits_future():
    import asyncio

    await asyncio.sleep(0.01)


def not_async():
    return 1


@tcc.effect
def maybe_die(step):
    if os.environ.get("DIE_AT") == str(step):
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
    return step


async def diverge():
    await echo(1)
    if os.environ.get("FLAVOR") == "b":
        await slow_echo(2)
    else:
        await echo(2)
    await maybe_die(3)
    return "done"


class Helper:
    """Not an entry: a class (``misc_agent.py:Helper``) or its method (``:Helper.run``)."""

    async def run(self):
        return 1
