"""Requests made but never awaited (issue 17, point 1)."""

import tcc


@tcc.effect
def step(i):
    return i


async def main():
    x = await step(1)
    y = step(2)
    return [x, y]


async def sleeper():
    await step(1)
    tcc.sleep(0)
    return "done"


async def late_but_fine():
    request = step(1)
    first = await request
    both = await tcc.gather(step(2), step(3))
    return [first, both]
