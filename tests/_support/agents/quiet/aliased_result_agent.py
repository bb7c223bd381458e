"""Effects that return shared objects: a module-level dict, and one cached object twice."""

import tcc

CONFIG = {"retries": 1}
_CACHE: dict[str, list[str]] = {}


@tcc.effect
async def get_config() -> dict:
    return CONFIG  # a loader that hands out its module-level dict


@tcc.effect
def lookup(name: str) -> list[str]:
    return _CACHE.setdefault(name, [name])  # a memoising effect: the same list each time


async def main():
    cfg = await get_config()
    cfg["retries"] += 1  # the agent changes what it got
    first = await lookup("a")
    first.append("seen")
    again = await lookup("a")
    return {"CONFIG": CONFIG, "cfg_is_CONFIG": cfg is CONFIG, "first": first, "again": again,
            "same": first is again}


CLIENT = tcc.resource(dict, name="client")  # built on first use, once per process


@tcc.effect
def hand_back(client) -> dict:
    return {"client": client}  # a result holding the resource it was given


async def resource():
    got = await hand_back(CLIENT)
    return {"same": got["client"] is CLIENT}
