"""The shared N-step benchmark agent (see the contract in ``benchmarks/peers/__init__.py``).

Kept free of third-party imports: the peer child scripts import it as a sibling module
(``import _agent``), so whole-process recovery times include only the peer's own imports.
"""

from __future__ import annotations

import hashlib
import os
import time
from typing import Any

ENTRY_BYTES = 1024  # regime "grow": bytes appended to the transcript per step
_WORK_SEED = b"tcc-benchmark-work"


def fake_llm(i: int) -> str:
    """Step i's fake LLM/tool call: a deterministic function of i."""
    return f"out-{i}"


def busy_work(iters: int) -> None:
    """CPU work between steps: ``iters`` chained SHA-256 hashes of a 32-byte value."""
    h = _WORK_SEED
    for _ in range(iters):
        h = hashlib.sha256(h).digest()


def calibrate_work(work_ms: float, *, rounds: int = 5) -> int:
    """Number of ``busy_work`` iterations that take about ``work_ms`` milliseconds here."""
    if work_ms <= 0:
        return 0
    probe = 20_000
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        busy_work(probe)
        best = min(best, time.perf_counter() - t)
    per_iter_ms = best * 1000.0 / probe
    return max(1, round(work_ms / per_iter_ms))


def transcript_entry(i: int, out: str) -> str:
    """Regime "grow": the ~1 KiB transcript entry appended after step i."""
    head = f"{out} [turn {i}] "
    return head + "." * (ENTRY_BYTES - len(head))


def initial_state(regime: str) -> dict[str, Any]:
    """The agent's state before step 0."""
    if regime not in ("const", "grow"):
        raise ValueError(f"unknown regime {regime!r}")
    state: dict[str, Any] = {"i": 0, "ok": True, "last": ""}
    if regime == "grow":
        state["transcript"] = []
    return state


def scalar_update(state: dict[str, Any], i: int, out: str) -> dict[str, Any]:
    """The constant-size fields after step i returned ``out``: counter, check flag, last output."""
    ok = bool(state["ok"] and state["i"] == i and out == fake_llm(i))
    return {"i": i + 1, "ok": ok, "last": out}


def advance(state: dict[str, Any], i: int, out: str) -> dict[str, Any]:
    """Apply step i's result to ``state`` in place (and return it)."""
    state.update(scalar_update(state, i, out))
    if "transcript" in state:
        state["transcript"].append(transcript_entry(i, out))
    return state


def expected_digest(n: int) -> str:
    """sha256 hex of ``"|".join(f"out-{i}" for i in range(n))``, first 16 characters."""
    return hashlib.sha256("|".join(fake_llm(i) for i in range(n)).encode()).hexdigest()[:16]


def expected_result(n: int) -> dict[str, Any]:
    """The final result every correct agent run returns."""
    return {"n": n, "digest": expected_digest(n)}


def final_result(state: dict[str, Any], n: int) -> dict[str, Any]:
    """The agent's final result from its final state."""
    outputs: list[str]
    if "transcript" in state:
        # regime "grow": the outputs are really read back from the transcript
        outputs = [entry.split(" ", 1)[0] for entry in state["transcript"]]
        ok = bool(state["ok"]) and len(outputs) == n
    else:
        # regime "const": every output was checked on arrival, in order, against fake_llm(i)
        ok = bool(state["ok"]) and state["i"] == n
        outputs = [fake_llm(i) for i in range(n)] if ok else []
    if not ok:
        return {"n": state["i"], "digest": "MISMATCH"}
    return {"n": n, "digest": hashlib.sha256("|".join(outputs).encode()).hexdigest()[:16]}


def bare_per_step_s(n: int, regime: str, iters: int, effects_path: str | None = None) -> float:
    """Seconds per step of the agent loop with no framework at all (the floor)."""
    fd = os.open(effects_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND) if effects_path else -1
    try:
        state = initial_state(regime)
        t = time.perf_counter()
        for i in range(n):
            busy_work(iters)
            out = fake_llm(i)
            if fd >= 0:
                os.write(fd, b"%d\n" % i)
            state = advance(state, i, out)
        elapsed = time.perf_counter() - t
    finally:
        if fd >= 0:
            os.close(fd)
    assert final_result(state, n) == expected_result(n)
    return elapsed / n
