"""Effects with a verify probe for the lost-intent rule's corner cases (FUNC selects one).

Environment: LEDGER (path, required): each write appends ``KEY TAG``; DIE_ON=tag SIGKILLs
the process right after that tag's line (once: LEDGER.died notes it); FAIL=path makes
``flaky`` raise while that file exists.
"""

import os
import signal

import tcc

LEDGER = os.environ["LEDGER"]


def probe(intent):
    """Exactly-once: if this call's key is in the ledger, the call happened."""
    try:
        with open(LEDGER) as fh:
            lines = fh.read().splitlines()
    except FileNotFoundError:
        return None
    for line in lines:
        key, _, tag = line.partition(" ")
        if key == intent.idempotency_key:
            return f"{tag} (found)"
    return None


def _line(tag):
    with open(LEDGER, "a") as fh:
        fh.write(f"{tcc.current().idempotency_key} {tag}\n")


def _die(tag):
    if os.environ.get("DIE_ON") == tag and not os.path.exists(LEDGER + ".died"):
        open(LEDGER + ".died", "w").close()
        os.kill(os.getpid(), signal.SIGKILL)


def _write(tag):
    _line(tag)
    _die(tag)
    return tag


def _fail(tag):
    raise RuntimeError(f"{tag} failed")


def _flaky(tag):
    _line(tag)
    if os.path.exists(os.environ.get("FAIL", "/nonexistent")):
        raise RuntimeError(f"{tag} failed")
    _die(tag)
    return tag


def _first_fails(tag):
    _line(tag)
    if tcc.current().attempt == 1:
        raise RuntimeError(f"{tag} failed on its first attempt")
    return tag


def _second_succeeds(tag):
    if tcc.current().attempt == 1:
        raise RuntimeError(f"{tag} failed on its first attempt")
    return _write(tag)


write = tcc.effect(_write, name="pd:write", verify=probe)
second = tcc.effect(_second_succeeds, name="pd:second", retries=1, retry_delay=0, verify=probe)
first_fails = tcc.effect(_first_fails, name="pd:first_fails", retries=1, retry_delay=0)
fail = tcc.effect(_fail, name="pd:fail", retries=1, retry_delay=0)
flaky = tcc.effect(_flaky, name="pd:flaky", verify=probe)


async def gather_then():
    """A gather whose failed call has a retry left (replay runs it again), then a call."""
    try:
        await tcc.gather(write("f"), fail("g"))
    except RuntimeError:
        pass
    return await write("e")


async def gather_retries():
    """A gathered call that fails once, with a retry: the gather retries it."""
    return await tcc.gather(write("x"), first_fails("y"))


async def gather_gives_up():
    """A gathered call whose retries are spent: the gather raises its last error."""
    try:
        await tcc.gather(write("x"), fail("g"))
    except RuntimeError as exc:
        return str(exc)
    return "no error"


async def gather_retry_dies():
    """A gathered call whose first attempt fails and whose retry dies after its effect."""
    return await tcc.gather(write("x"), second("z"))


async def flaky_once():
    return await flaky("h")


async def write_then_flaky():
    """A call, then a flaky one: a fork from the snapshot between them makes the second."""
    a = await write("a")
    return f"{a} {await flaky('h')}"
