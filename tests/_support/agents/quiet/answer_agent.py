"""An agent whose frame stores the pending answer straight away (issue 17, points 6 and 8)."""

import os

import tcc


@tcc.effect
def llm(prompt):
    return f"model on {prompt}"


@tcc.effect(retries=1, retry_delay=0)
def api(i):
    if os.path.exists(os.environ.get("OUTAGE", "/nonexistent")):
        raise ConnectionError(f"service down for call {i}")
    return f"api {i}"


async def main():
    answer = await llm("first")
    follow = await llm(f"follow-up to {answer}")
    return [answer, follow]


async def calls_api():
    a = await api(1)
    b = await api(2)
    return [a, b]


async def buggy():
    await llm("x")
    return {}["missing_key"]


async def gathered():
    first, second = await tcc.gather(llm("x"), llm("y"))
    return [first, second]
