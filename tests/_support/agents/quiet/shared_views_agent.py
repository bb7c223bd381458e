"""Objects that are views of, or add attributes to, something the agent keeps using across
effects.  A resumed run must see them as an uninterrupted run does.

``window``: a memoryview window into a bytearray that later steps fill through the window;
``registry``: a read-only ``MappingProxyType`` of a dict that gains tools later;
``budget``: a ``Counter`` subclass whose instance sets its own limit (its ``__reduce__``
leaves instance attributes out), and a ``defaultdict`` subclass with a tag.
"""

import collections
import types

import tcc


@tcc.effect
def fetch(i: int) -> bytes:
    return bytes([65 + i]) * 2


@tcc.effect
def spend(tokens: int) -> int:
    return tokens


async def window():
    buf = bytearray(b"." * 8)
    view = memoryview(buf)[2:6]  # the header's window
    for i in range(2):
        chunk = await fetch(i)
        view[2 * i:2 * i + 2] = chunk  # written through the window: buf sees it
    return {"buf": buf.decode(), "view": view.tobytes().decode(), "kind": type(view).__name__}


async def registry():
    tools = {"alpha": 1}
    known = types.MappingProxyType(tools)
    for i, name in enumerate(["beta", "gamma", "delta"]):
        await fetch(i)
        tools[name] = i + 2
    return {"known": sorted(known), "kind": type(known).__name__}


class TokenBudget(collections.Counter):
    limit = 1000  # the class default; an instance sets its own


class Tagged(collections.defaultdict):
    pass


async def budget():
    used = TokenBudget()
    used.limit = 200
    tagged = Tagged(list)
    tagged.tag = "run"
    steps = 0
    while used["tokens"] < used.limit:
        used["tokens"] += await spend(40)
        tagged[used["tokens"] % 80].append(steps)
        steps += 1
    return {"steps": steps, "tokens": used["tokens"], "limit": used.limit, "tag": tagged.tag}
