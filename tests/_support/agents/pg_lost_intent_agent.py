"""Ledger effects, one of which waits while the test kills the PostgreSQL server.

Environment: LEDGER (path, required), STEPS (default 5), CRASH_AT (the step whose
effect waits, default 3), HANDSHAKE (a path prefix, required), VERIFY=1 to give the
effect a verify probe that finds its own ledger line.

The effect at step CRASH_AT appends its ledger line (``KEY VALUE``), then, if
``HANDSHAKE.go`` does not exist yet, creates ``HANDSHAKE.ready`` and waits (up to
60 s) for the test to kill the server and create ``HANDSHAKE.go``.  The intent of
that call was committed without waiting for its WAL flush, so the dead server may
have taken it with it: the run's next commit then finds its connection gone.  On
resume, ``HANDSHAKE.go`` exists and the effect no longer waits.
"""

import os
import random
import time

import tcc

LEDGER = os.environ["LEDGER"]
CRASH_AT = int(os.environ.get("CRASH_AT", "3"))
HANDSHAKE = os.environ["HANDSHAKE"]


def probe(intent):
    """Exactly-once: if this call's line is already in the ledger, reuse its value."""
    try:
        with open(LEDGER) as fh:
            lines = fh.read().splitlines()
    except FileNotFoundError:
        return None
    for line in lines:
        key, _, value = line.partition(" ")
        if key == intent.idempotency_key:
            return int(value)
    return None


def _append(step, salt):
    value = step * 1000 + salt
    with open(LEDGER, "a") as fh:
        fh.write(f"{tcc.current().idempotency_key} {value}\n")
    if step == CRASH_AT and not os.path.exists(HANDSHAKE + ".go"):
        open(HANDSHAKE + ".ready", "w").close()
        deadline = time.monotonic() + 60
        while not os.path.exists(HANDSHAKE + ".go") and time.monotonic() < deadline:
            time.sleep(0.01)
    return value


append = tcc.effect(_append, name="pg_lost_intent:append")
append_verified = tcc.effect(_append, name="pg_lost_intent:append_verified", verify=probe)


async def main():
    steps = int(os.environ.get("STEPS", "5"))
    effect = append_verified if os.environ.get("VERIFY") == "1" else append
    total = 0
    for step in range(1, steps + 1):
        value = await effect(step, random.randrange(1000))
        assert value // 1000 == step
        total += value // 1000
    return {"steps": steps, "total": total}
