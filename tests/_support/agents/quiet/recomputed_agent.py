"""A call in flight at a crash whose argument the resumed code computes anew (a random id)."""

import os
import signal

import tcc


@tcc.effect
def hello() -> str:
    return "hi"


@tcc.effect
def create_order(order_id: str) -> str:
    if os.environ.get("KILL_IN_CALL") and not os.path.exists(os.environ["MARK"]):
        open(os.environ["MARK"], "w").close()
        os.kill(os.getpid(), signal.SIGKILL)  # in flight: the call is re-issued on resume
    return f"created {order_id}"


async def main():
    await hello()  # the snapshot the resume starts from
    order_id = os.urandom(4).hex()  # computed again after the crash: another value
    ack = await create_order(order_id)
    return ack == f"created {order_id}"
