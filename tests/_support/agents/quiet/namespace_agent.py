"""Held in a local across effects: the module's globals() and os.environ, which must stay
the live namespace and environment after a restore (not copies); and a weakref.proxy, which
tcc cannot keep and refuses."""
import os
import weakref

import tcc

COUNTER = 0


def current():
    return COUNTER


@tcc.effect
def record(i, v):
    return v


async def through_globals():
    g = globals()
    out = []
    for i in range(4):
        g["COUNTER"] += 1
        out.append(await record(i, current()))
    return out


async def through_environ():
    env = os.environ
    out = []
    for i in range(4):
        env["TCC_TEST_STEP"] = str(i)
        out.append(await record(i, os.environ.get("TCC_TEST_STEP")))
    return out


class Stats:
    def __init__(self):
        self.total = 0


async def through_proxy():
    stats = Stats()
    w = weakref.proxy(stats)
    for i in range(3):
        w.total += await record(i, 10)
    return stats.total
