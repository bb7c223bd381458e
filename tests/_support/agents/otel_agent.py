"""Agents whose spans go to an OTLP receiver (tests/runtime/test_otlp.py).

``main`` runs three quick steps, then ``gate``, then two more steps.  ``gate`` notes
that it started (``$GATE.started``) and polls until the file named by $GATE exists
(or 120 s pass), so a test can kill or stop the run while it is in that effect.
``parks`` runs one step and parks at an approval.
"""

import os
import time

import tcc


@tcc.effect
def step(i):
    return f"step {i}"


@tcc.effect
def gate():
    gate_file = os.environ["GATE"]
    with open(gate_file + ".started", "a") as fh:
        fh.write(f"{os.getpid()}\n")
    deadline = time.monotonic() + 120
    while not os.path.exists(gate_file) and time.monotonic() < deadline:
        time.sleep(0.02)
    return "through the gate"


async def main():
    done = [await step(i) for i in range(3)]
    done.append(await gate())
    done += [await step(i) for i in range(3, 5)]
    return done


async def parks():
    first = await step(0)
    ok = await tcc.approval("go on?")
    return [first, ok]
