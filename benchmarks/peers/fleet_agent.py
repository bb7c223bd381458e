"""The fleet benchmark's agent for tcc (``benchmarks.fleet``); ``fleet_child_dbos.py`` is its
DBOS twin, step for step.

``main(log, tag, steps, delay)``: ``steps`` effects ``fleet:step``; effect ``i`` appends
``"TAG I TIME PID"`` to ``log`` (one ``O_APPEND`` write: the timestamp of every execution,
and the process that made it) and returns ``i``.  ``delay`` seconds of plain sleep between
effects (the takeover runs use it to be long-lived; the throughput runs have none).  The
result is ``{"tag": tag, "steps": steps, "total": sum(range(steps))}``.
"""

from __future__ import annotations

import os
import time
from typing import Any

import tcc


@tcc.effect(name="fleet:step")
def step(log: str, tag: str, i: int) -> int:
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, f"{tag} {i} {time.time():.6f} {os.getpid()}\n".encode())
    finally:
        os.close(fd)
    return i


async def main(log: str, tag: str, steps: str = "5", delay: str = "0") -> dict[str, Any]:
    n, pause = int(steps), float(delay)
    total = 0
    for i in range(n):
        total += await step(log, tag, i)
        if pause:
            time.sleep(pause)
    return {"tag": tag, "steps": n, "total": total}
