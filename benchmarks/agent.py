"""The N-step benchmark agent, shared by every strategy (and mirrored by the peers).

Step ``i`` calls the effect ``bench:step`` which returns ``f"out-{i}"``.
Between steps the agent may burn ``work_ms`` of CPU (prompt building,
parsing) and keeps either a constant small state or a transcript that grows
by ~1 KiB per step.  The result is ``{"n": n, "digest": sha256("|".join(outputs)).hexdigest()[:16]}``.

Environment hooks (used by the harness):

* ``BENCH_KILL_AT=k``   SIGKILL this process at the start of step k (its intent
                        is journaled, its completion is not: an in-doubt call);
* ``BENCH_FIRST=path``  the first step executed in this process writes
                        ``time.time()`` to ``path`` and exits at once -- the
                        moment recovery issues its first new effect.
"""

from __future__ import annotations

import hashlib
import os
import signal
import time
from typing import Any

import tcc


class FirstEffect(BaseException):
    """Raised by the in-process hook to stop a recovery at its first new effect."""


IN_PROCESS_HOOK: list[Any] = []  # [callable] while the harness measures in-process


def burn(work_ms: float) -> None:
    """Spend about ``work_ms`` of CPU like prompt building or parsing would."""
    if work_ms <= 0:
        return
    deadline = time.perf_counter() + work_ms / 1000
    data = b"prompt"
    while time.perf_counter() < deadline:
        data = hashlib.sha256(data).digest()


@tcc.effect(name="bench:step")
def step(i: int) -> str:
    if IN_PROCESS_HOOK:
        IN_PROCESS_HOOK[0](i)
    if os.environ.get("BENCH_KILL_AT") == str(i):
        os.kill(os.getpid(), signal.SIGKILL)
    first = os.environ.get("BENCH_FIRST")
    if first:
        with open(first, "w") as fh:
            fh.write(repr(time.time()))
        os._exit(0)
    return f"out-{i}"


def digest(outputs: list[str]) -> str:
    return hashlib.sha256("|".join(outputs).encode()).hexdigest()[:16]


async def main(n: str = "10", regime: str = "const", work_ms: str = "0") -> dict[str, Any]:
    steps, work = int(n), float(work_ms)
    outputs: list[str] = []
    transcript: list[str] = []
    state_bytes = int(regime.split(":")[1]) if regime.startswith("size:") else 0
    blob = [f"{j:08d}" * 16 for j in range(state_bytes // 128)]  # constant state of that size
    for i in range(steps):
        burn(work)
        out = await step(i)
        outputs.append(out)
        if regime == "grow":
            transcript.append(out.ljust(1024, "."))
    del blob, transcript
    return {"n": steps, "digest": digest(outputs)}
