"""Module-level state mutated by the agent (issue 17, point 2)."""

import threading

import tcc
from globals_helper import HISTORY, remember

SEEN = []
COUNT = {"n": 0}
TOTAL = 0
LOCK = threading.Lock()  # cannot be captured: rebuilt by the import


@tcc.effect
def step(i):
    return i * 10


async def main():
    global TOTAL
    alias = SEEN  # a local and a global naming one list
    for i in range(6):
        value = await step(i)
        with LOCK:
            SEEN.append(value)
            COUNT["n"] += 1
            TOTAL += value
            remember(value)
    return [len(SEEN), COUNT["n"], TOTAL, alias is SEEN, len(HISTORY)]


async def rebinds():
    global LOCK
    await step(1)
    LOCK = threading.Lock()  # a new object that cannot be captured
    await step(2)
    return "unreachable"
