"""A failing call after a few steps, for tcc retry under hybrid (review of issue 17)."""

import os, tcc
OK = os.environ.get("OK_FILE", "/nonexistent")
LOG = []

@tcc.effect
async def step(i):
    return i

@tcc.effect(retries=1, retry_delay=0)
async def flaky(x):
    if not os.path.exists(OK):
        raise ConnectionError("outage")
    return f"flaky({x})"

async def main():
    out = []
    for i in range(3):
        out.append(await step(i))
        LOG.append(i)
    out.append(await flaky(len(out)))
    out.append(await step(99))
    return [out, LOG]
