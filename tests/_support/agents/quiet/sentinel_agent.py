"""Sentinels held across effects: a library's ``MISSING = object()`` (returned by its cache
and bound here by ``from ... import``) and ``dataclasses.MISSING``.  After a crash, ``hit is
MISSING`` must answer as before: a copy of the sentinel made a miss look like a hit, and
the agent skipped a fetch and cached nothing."""

import dataclasses

import tcc
from sentinel_lib import MISSING, Cache


@tcc.effect
def fetch(key: str) -> str:
    return key.upper()


@tcc.effect
def note(text: str) -> None:
    return None


async def main():
    cache = Cache()
    out = []
    for key in ["a", "b", "a", "c", "b"]:
        hit = cache.get(key)
        default = dataclasses.MISSING
        await note("looked up " + key)  # `hit` and `default` are held across this effect
        if hit is MISSING:
            cache.data[key] = await fetch(key)
            out.append(["miss", key])
        else:
            out.append(["hit", key])
        out.append(default is dataclasses.MISSING)
    return out
