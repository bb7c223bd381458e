"""The program's own subclasses of built-in value types held across effects: pickle's default
rebuilt them through the base's reduction, which calls the subclass's __init__/__new__ with
the base's arguments (a TagSet(owner) lost its items, an LRU(capacity) could not be made at
all) or left its attributes out (a Money came back without its currency).  A class whose
__new__ takes an argument says so with __getnewargs__."""
import collections
import decimal
import random

import tcc


@tcc.effect
def fetch(k):
    return k * 10


class LRU(collections.OrderedDict):
    def __init__(self, capacity):
        super().__init__()
        self.capacity = capacity

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        self.move_to_end(key)
        if len(self) > self.capacity:
            self.popitem(last=False)


class TagSet(set):
    def __init__(self, owner):
        super().__init__()
        self.owner = owner


class Recent(collections.deque):
    def __init__(self, label):
        super().__init__(maxlen=3)
        self.label = label


class Dice(random.Random):
    def __init__(self, seed, tag):
        super().__init__(seed)
        self.tag = tag


class Money(decimal.Decimal):
    currency = "USD"


class Symbol:
    def __new__(cls, name):
        obj = super().__new__(cls)
        obj.name = name
        return obj

    def __getnewargs__(self):  # (without it, tcc refuses a Symbol while the run is live)
        return (self.name,)


async def main():
    cache, tags, recent, dice = LRU(3), TagSet("alice"), Recent("recent"), Dice(7, "planner")
    price = Money("12.50")
    price.currency = "EUR"
    sym = Symbol("alpha")
    rolls = []
    for k in [1, 2, 3, 1, 4, 5, 1]:
        if k not in cache:
            cache[k] = await fetch(k)
        else:
            cache.move_to_end(k)
        tags.add(f"tag{k}")
        recent.append(k)
        rolls.append(dice.randint(1, 6))
    return {"cache": list(cache.items()), "tags": sorted(tags), "owner": tags.owner,
            "recent": list(recent), "label": recent.label, "maxlen": recent.maxlen,
            "rolls": rolls, "tag": dice.tag, "price": [str(price), price.currency], "sym": sym.name}


class Interned:
    """__new__ takes a name and nothing tells pickle: refused while the run is live."""

    def __new__(cls, name):
        obj = super().__new__(cls)
        obj.name = name
        return obj


async def unpicklable_new():
    kept = Interned("x")
    await fetch(1)
    return kept.name
