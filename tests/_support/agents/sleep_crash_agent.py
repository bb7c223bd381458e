"""A run that parks in a sleep, then dies inside the effect after it.

Environment: LEDGER (path, required).  The effect kills its process (SIGKILL) the
first time it runs (a marker file beside the ledger notes that it did), after
noting the start in the ledger; the second time it completes.
"""

import os
import signal

import tcc

LEDGER = os.environ["LEDGER"]


@tcc.effect
def step(x):
    with open(LEDGER, "a") as fh:
        fh.write(f"step {x}\n")
    if not os.path.exists(LEDGER + ".died"):
        open(LEDGER + ".died", "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    return x * 10


async def main():
    await tcc.sleep(0.3)
    return await step(1)


async def approved():
    ok = await tcc.approval("go on?")
    return await step(2 if ok else 3)
