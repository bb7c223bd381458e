"""An effect that mutates its argument (issue 17, point 3)."""

import os
import signal

import tcc


@tcc.effect
def chat(messages, i):
    messages.append(f"reply {i}")  # mutates the argument it received
    if os.environ.get("KILL_IN_CALL") == str(i) and not os.path.exists(os.environ["MARK"]):
        open(os.environ["MARK"], "w").close()
        os.kill(os.getpid(), signal.SIGKILL)  # in flight: the call is re-issued on resume
    return len(messages)


async def main():
    messages = ["system"]
    sizes = []
    for i in range(4):
        messages.append(f"user {i}")
        sizes.append(await chat(messages, i))
    return [sizes, messages]


async def gathered():
    messages = ["system"]
    sizes = await tcc.gather(chat(messages, 0), chat(messages, 1))
    return [sizes, messages]
