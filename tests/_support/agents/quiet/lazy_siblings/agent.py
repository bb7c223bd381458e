"""Sibling modules imported lazily mid-run, one named tcc-something (review of issue 17)."""

import tcc

@tcc.effect
async def step(i):
    return i

async def main():
    for i in range(3):
        import tccstate, mystate   # lazily, mid-run
        v = await step(i)
        tccstate.LOG.append(v); mystate.LOG.append(v)
    return [tccstate.LOG, mystate.LOG]
