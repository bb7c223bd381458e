"""A run whose snapshot and journal run code when unpickled: a ``Bomb`` in both.

Environment: BOMB_MARKER (a path).  ``arm()`` (an effect) returns a :class:`Bomb`, so
the journal's completion holds one; the run then waits for the signal ``go``, so its
snapshot holds one too (the local ``bomb``).  Unpickling a Bomb anywhere -- resuming the
run, replaying the journal, ``tcc inspect --unsafe-repr`` -- appends a line to the file
it names: the tests plant these records, sealed with another store's key, in a store,
and check that the file never appears (the records fail their MAC and are never
unpickled), then that it does appear when the records' own store loads them.
"""

import os

import tcc


class Bomb:
    """Unpickled, it writes to ``path`` (as any code a pickle names could run)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        with open(state["path"], "a") as fh:
            fh.write(f"unpickled in pid {os.getpid()}\n")


@tcc.effect
def arm(path):
    return Bomb(path)


async def main():
    bomb = await arm(os.environ["BOMB_MARKER"])
    go = await tcc.wait_for("go")
    return {"armed": bomb.path, "go": go}
