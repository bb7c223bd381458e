"""The N-step benchmark agent, shared by every strategy (and mirrored by the peers).

Step ``i`` calls the effect ``bench:step`` which returns ``f"out-{i}"``
(the contract in ``benchmarks/peers/__init__.py``, which DBOS and LangGraph
follow too).  Between steps the agent may do ``work_iters`` rounds of SHA-256 (prompt
building, parsing; calibrated by the harness to ~0.5 ms) and keeps either a constant small state or a transcript that grows
by ~1 KiB per step.  The result is ``{"n": n, "digest": sha256("|".join(outputs)).hexdigest()[:16]}``.

Environment hooks (used by the harness):

* ``BENCH_KILL_AT=k``   SIGKILL this process at the start of step k (its intent
                        is journaled, its completion is not: an in-doubt call);
* ``BENCH_FIRST=path``  the first step executed in this process writes
                        ``time.time()`` to ``path`` and exits at once -- the
                        moment recovery issues its first new effect.

It has a folder of its own: a snapshot records the module-level data of the modules in the
script's folder (``tcc.runtime._globals``), and the harness runs some sections in-process,
with its own modules loaded.  Next to them, every tcc step of those sections would also
pickle the harness's globals (its profiles, its shuffling ``random.Random``), and every
in-process recovery would write their snapshot values back over the live harness.
"""

from __future__ import annotations

import hashlib
import os
import random
import signal
import sys
import time
from typing import Any

import tcc

_PEERS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "peers")
if _PEERS not in sys.path:
    sys.path.insert(0, _PEERS)
import _agent  # noqa: E402  the peers' shared agent: the same messages, sizes and checks


class FirstEffect(BaseException):
    """Raised by the in-process hook to stop a recovery at its first new effect."""


class Harness:
    """What the harness sets in-process.  A class attribute, not a module-level list: tcc
    records module-level data in snapshots and writes it back on resume (README,
    "Module-level data"), which would replace a hook the harness installed."""

    in_process_hook: list[Any] = []  # [callable] while the harness measures in-process


def busy_work(iters: int) -> None:
    """CPU work between effects (prompt building, parsing): the peers' exact loop."""
    h = b"tcc-benchmark-work"
    for _ in range(iters):
        h = hashlib.sha256(h).digest()


@tcc.effect(name="bench:step")
def step(i: int, regime: str = "const") -> Any:
    if Harness.in_process_hook:
        Harness.in_process_hook[0](i)
    if os.environ.get("BENCH_KILL_AT") == str(i):
        os.kill(os.getpid(), signal.SIGKILL)
    first = os.environ.get("BENCH_FIRST")
    if first:
        with open(first, "w") as fh:
            fh.write(repr(time.time()))
        os._exit(0)
    return _agent.fake_llm(i, regime)  # grow, mutate: the message (journaled, as a real reply)


def digest(outputs: list[str]) -> str:
    return hashlib.sha256("|".join(outputs).encode()).hexdigest()[:16]


async def main(n: str = "10", regime: str = "const", work_iters: str = "0") -> dict[str, Any]:
    """The peers' contract (benchmarks/peers/__init__.py), step for step."""
    steps, work = int(n), int(work_iters)
    ok, done, last = True, 0, ""
    transcript: list[dict[str, Any]] = []
    memory: dict[str, dict[str, Any]] = {}
    state_bytes = int(regime.split(":")[1]) if regime.startswith("size:") else 0
    blob = [f"{j:08d}" * 16 for j in range(state_bytes // 128)]  # state of that size
    # ``hold:B``: one unchanged ``bytes`` of B bytes (a model, a document) held all along
    held = random.Random(0).randbytes(int(regime.split(":")[1])) if regime.startswith("hold:") else b""
    for i in range(steps):
        busy_work(work)
        out = await step(i, regime)
        ok = ok and done == i and _agent.out_name(out) == f"out-{i}"
        done, last = i + 1, _agent.out_name(out)
        if blob:  # ``size:B``: one 128-byte element of the state rewritten per step
            blob[i % len(blob)] = f"{i:08d}" * 16
        if regime == "grow":
            transcript.append(out)
        elif regime == "mutate":
            memory[_agent.memory_slot(i)] = out
    del blob, last, held
    if regime == "grow":
        outputs = [entry["name"] for entry in transcript]
    else:  # constant state: each output was checked on arrival
        outputs = [f"out-{k}" for k in range(done)]
    if regime == "mutate":
        ok = ok and _agent.memory_ok(memory, steps)
    if not ok or done != steps:
        return {"n": done, "digest": "MISMATCH"}
    return {"n": steps, "digest": digest(outputs)}
