"""A loop of effect calls whose arguments an edit changes (issue 17, point 4)."""

import tcc

FACTOR = 1


@tcc.effect
def step(i):
    return i


async def main():
    out = []
    for i in range(6):
        out.append(await step(i * FACTOR))
    return out
