"""Loops over dict views and dict iterators that stay open across effects.

``main``: ``.items()`` and ``.values()`` loops whose dict gets new values for keys the loop
has not reached yet; ``pending``: a ``keys()`` view that follows the dict as tasks are
popped from it.  A resumed run must read the dict as it is then, as an uninterrupted run
does, not a copy frozen at the snapshot.
"""

import tcc


@tcc.effect
def score(key: str, value: int) -> int:
    return value + 1


async def main():
    budget = {"k1": 1, "k2": 1, "k3": 1}
    keys = list(budget)
    for i, (key, value) in enumerate(budget.items()):
        got = await score(key, value)
        if i + 1 < len(keys):
            budget[keys[i + 1]] += got  # a value the loop has not reached yet
    later = {"p": 1, "q": 2, "r": 3}
    seen = []
    for value in reversed(later.values()):
        seen.append(value)
        await score("seen", value)
        later["p"] = 10 * later["p"]
    return {"budget": budget, "seen": seen}


async def pending():
    tasks = {"t1": "fetch", "t2": "parse", "t3": "store"}
    waiting = tasks.keys()  # a live view: it empties as tasks are popped
    done = []
    while waiting and len(done) < 6:  # (the bound stops a view that never empties)
        name = min(waiting)
        done.append(await score(name, len(done)))
        tasks.pop(name)
    return {"done": done, "left": list(waiting)}
