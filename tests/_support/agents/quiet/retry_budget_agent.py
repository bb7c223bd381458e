"""An effect with ``retries=2`` whose upstream fails its first two answers, and whose process
is killed (SIGKILL from inside the call, as an OOM kill would) during its first attempt when
``$CRASH_ONCE`` names a file that does not exist yet.  Uninterrupted, the third attempt
succeeds; a crash must not use up a retry (it did: the call gave up after two failures)."""

import os
import signal

import tcc

STATE = os.environ["UPSTREAM_STATE"]


def _killed_once() -> None:
    flag = os.environ.get("CRASH_ONCE")
    if flag and not os.path.exists(flag):
        open(flag, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)


def _upstream(x: str) -> str:
    state = os.path.join(STATE, x)  # a file per caller: gathered calls run side by side
    fails = os.path.getsize(state) if os.path.exists(state) else 0
    if fails < int(os.environ.get("FAILS", "2")):  # down for its first answers to each caller
        with open(state, "a") as f:
            f.write("x")
        raise ConnectionError(f"503 for {x}")
    return f"ok {x}"


@tcc.effect(retries=2, retry_delay=0.01)
def api(x: str) -> str:
    _killed_once()
    return _upstream(x)


async def main():
    try:
        return await api("charge-42")
    except ConnectionError as exc:
        return f"gave up: {exc}"


async def gathered():
    try:
        return await tcc.gather(api("a"), api("b"))
    except ConnectionError as exc:
        return f"gave up: {exc}"


async def uncaught():
    return await api("charge-43")
