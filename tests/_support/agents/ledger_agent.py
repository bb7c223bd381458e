"""N file-appending effects; the ledger shows what really happened.

Environment: LEDGER (path, required), STEPS (default 40), DELAY (seconds in
each effect), DIE_AT=k to SIGKILL the process inside step k, VERIFY=1 to give the effect a verify probe that finds its own
ledger line (exactly-once).  SALT=step makes the salt a function of the step, as the
replay and hybrid strategies require (a journaled answer is served only to the call
recorded, with the same arguments).
"""

import os
import random
import signal
import time

import tcc

LEDGER = os.environ["LEDGER"]
DELAY = float(os.environ.get("DELAY", "0"))


def _lines():
    try:
        with open(LEDGER) as fh:
            return fh.read().splitlines()
    except FileNotFoundError:
        return []


def probe(intent):
    """Exactly-once: if this call's line is already in the ledger, reuse it."""
    for line in _lines():
        key, _, value = line.partition(" ")
        if key == intent.idempotency_key:
            return int(value)
    return None


def _append(step, salt):
    if os.environ.get("DIE_AT") == str(step):  # a deterministic crash, mid-effect
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(DELAY * random.random())
    value = step * 1000 + salt
    with open(LEDGER, "a") as fh:
        fh.write(f"{tcc.current().idempotency_key} {value}\n")
        fh.flush()
    time.sleep(DELAY * random.random())
    return value


append = tcc.effect(_append, name="ledger:append")
append_verified = tcc.effect(_append, name="ledger:append_verified", verify=probe)


async def main(steps=None):
    steps = int(steps or os.environ.get("STEPS", "40"))
    effect = append_verified if os.environ.get("VERIFY") == "1" else append
    total = 0
    seen = []
    for step in range(steps):
        # nondeterministic: in-doubt calls must reuse it (unless SALT=step, for replay)
        salt = step * 37 % 1000 if os.environ.get("SALT") == "step" else random.randrange(1000)
        value = await effect(step, salt)
        assert value // 1000 == step
        seen.append(value % 1000)
        total += value // 1000
    return {"steps": steps, "total": total, "salts": len(seen)}
