"""Two gathered effects with a verify probe; one kills its process after its side effect.

Environment: LEDGER (path, required), DIE_ON=tag to SIGKILL the process right after
the call with that tag wrote its ledger line (once: a marker file beside the ledger
notes that it happened).  VERIFY=0 drops the probe.
"""

import os
import signal

import tcc

LEDGER = os.environ["LEDGER"]
MARKER = LEDGER + ".died"


def probe(intent):
    """Exactly-once: if this call's line is already in the ledger, reuse its value."""
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


def _write(tag):
    with open(LEDGER, "a") as fh:
        fh.write(f"{tcc.current().idempotency_key} {tag}\n")
    if os.environ.get("DIE_ON") == tag and not os.path.exists(MARKER):
        open(MARKER, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    return tag


write = tcc.effect(_write, name="gv:write", verify=None if os.environ.get("VERIFY") == "0" else probe)


async def main():
    first = await write("solo")  # a sequential call, so the gather is not the first call
    pair = await tcc.gather(write("a"), write("b"))
    return [first, *pair]
