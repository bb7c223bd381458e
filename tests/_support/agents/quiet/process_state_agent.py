"""Process state that snapshots do not hold, set by the agent's own code (README, "Process state")."""

import decimal
import random
from random import seed as reseed

import tcc


@tcc.effect
def step(n: int) -> int:
    return n


class Registry:
    count = 0  # (the class body itself is the import's: not named)

    @classmethod
    def bump(cls):
        cls.count += 1


def seen(item, memo=[]):
    memo.append(item)
    return len(memo)


def tag(x):
    return x


async def main():
    random.seed(7)
    reseed(8)
    decimal.getcontext().prec = 4
    Registry.count += 1
    Registry.bump()
    tag.calls = 1
    seen("a")
    local_rng = random.Random(3)  # held in a variable: captured, and not named
    await step(1)
    return local_rng.random() < 1
