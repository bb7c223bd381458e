"""Agents whose sync effects get stuck past their timeout (tests/runtime/test_stuck_threads.py).

A stuck call polls for the file named by $STUCK_RELEASE and returns once it
exists (or after 600 s); every start is noted in $STUCK_LEDGER.
"""

import os
import time

import tcc


def note(line):
    with open(os.environ["STUCK_LEDGER"], "a") as f:
        f.write(f"{line}\n")


def _block(x):
    note(f"start {x} pid {os.getpid()}")
    deadline = time.monotonic() + 600
    while not os.path.exists(os.environ["STUCK_RELEASE"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return f"done {x}"


@tcc.effect(retries=1, timeout=0.3)
def stuck_retried(x):
    return _block(x)


@tcc.effect(timeout=0.3)
def stuck_once(x):
    return _block(x)


@tcc.effect
def quick(x):
    note(f"quick {x}")
    return f"quick {x}"


@tcc.effect(retries=1, retry_delay=600)
def flaky(x):
    note(f"flaky {x} attempt {tcc.current().attempt}")
    if tcc.current().attempt == 1:
        raise ConnectionError("first attempt fails")
    return f"flaky {x} ok"


async def retry_after_stuck():
    """The first attempt times out; the retry waits for its thread (SIGTERM here)."""
    return await stuck_retried(1)


async def finish_with_a_stuck_thread():
    """The run ends while a timed-out call's thread is still stuck."""
    try:
        await stuck_once(1)
    except TimeoutError as exc:
        return f"gave up: {exc}"


async def gather_after_stuck():
    """A gathered call of an effect waits for that effect's stuck thread (SIGTERM here)."""
    try:
        await stuck_once(1)
    except TimeoutError:
        pass
    return await tcc.gather(quick(2), stuck_once(3))


async def long_backoff():
    """The first attempt fails; the retry back-off is 600 s (SIGTERM here)."""
    return await flaky(1)


async def park_with_a_stuck_thread():
    """A timed-out call's thread is still stuck when the run parks for an approval."""
    try:
        await stuck_once(1)
    except TimeoutError:
        pass
    return await tcc.approval("go on?")
