"""The shared N-step benchmark agent (see the contract in ``benchmarks/peers/__init__.py``).

Kept free of third-party imports: the peer child scripts import it as a sibling module
(``import _agent``), so whole-process recovery times include only the peer's own imports.
"""

from __future__ import annotations

import hashlib
import math
import os
import random
import re
import time
from typing import Any

_WORK_SEED = b"tcc-benchmark-work"
REGIMES = ("const", "grow", "mutate")
MEMORY_SLOTS = 16  # regime "mutate": the scratchpad's size, one slot rewritten per step

# The text of the transcript (regimes "grow" and "mutate"): real English prose and real
# source code, not padding, so that compression and chunking see what they would see in an
# agent.  Both come from the running interpreter's standard library (the same bytes in the
# crashed and the recovering process): prose from the docstrings of these modules, tool
# outputs from their source text.
TEXT_SOURCES = ("argparse.py", "asyncio/tasks.py", "functools.py", "json/decoder.py", "shutil.py",
                "subprocess.py", "textwrap.py", "typing.py")  # single files on 3.11-3.13
# Sizes (our choice, stated in the paper): two turns in three are assistant replies of 200 to
# 1,200 characters (uniform); every third is a tool output, log-normal with a median of
# 3 KiB and sigma 0.6, clipped to 1-8 KiB (a file read, a search result page).  ~1.7 KB per
# step on average.
REPLY_CHARS = (200, 1200)
TOOL_MEDIAN, TOOL_SIGMA, TOOL_CLIP = 3072, 0.6, (1024, 8192)


def fake_llm(i: int, regime: str = "const") -> Any:
    """Step i's fake LLM/tool call, a deterministic function of i: ``out-i``, or in regimes
    "grow" and "mutate" the chat message the step adds (named ``out-i``).  The message is the
    call's result, as a model's reply or a tool's output is, so every system records it as
    it would record a real one (a journal, a step output, a checkpoint)."""
    out = f"out-{i}"
    return transcript_entry(i, out) if regime in ("grow", "mutate") else out


def out_name(out: Any) -> str:
    """The ``out-i`` a step's result carries (itself, or a message's ``name``)."""
    return out if isinstance(out, str) else str(out["name"])


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


class _Corpus:
    """The prose paragraphs and the source text, read once per process.  Class attributes,
    not module-level data: tcc records a module's data in every snapshot (README,
    "Module-level data"), and the corpus is not the agent's state."""

    prose: list[str] = []
    source: str = ""


def _corpus() -> _Corpus:
    if not _Corpus.prose:
        root = os.path.dirname(os.__file__)  # the standard library
        text = []
        for name in TEXT_SOURCES:
            try:
                with open(os.path.join(root, name), encoding="utf-8") as fh:
                    text.append(fh.read())
            except FileNotFoundError:  # a module that became a package in a later Python
                continue
        if len(text) < len(TEXT_SOURCES) // 2:
            raise RuntimeError(f"the benchmark's text corpus is missing from {root}: {TEXT_SOURCES}")
        source = "\n".join(text)
        docs = re.findall(r'"""(.*?)"""', source, re.S)
        paragraphs = (" ".join(p.split()) for doc in docs for p in doc.split("\n\n"))
        _Corpus.prose = [p for p in paragraphs if len(p) >= 80]
        _Corpus.source = source
    return _Corpus


def warm() -> None:
    """Read the corpus now (~20 ms), not inside the first step that needs it: every child
    does this before its timed loop, so no system's step figure carries it."""
    _corpus()


def note_mark(i: int, marks: frozenset[int], into: dict[str, float], effects_fd: int) -> None:
    """At the start of step i of a crash child: if a run of i + 1 steps would be killed here
    (i + 1 in ``marks``), note the time and the effect log's size (steps 0..i-1 logged) in
    ``into``, which ``_harness.step_run`` reads and checks."""
    if i + 1 in marks:
        into[f"t_mark_{i + 1}"] = time.time()
        into[f"effects_at_{i + 1}"] = os.fstat(effects_fd).st_size


def transcript_entry(i: int, out: str) -> dict[str, Any]:
    """The chat message step i adds (regime "grow": appended; "mutate": written to a slot).

    A deterministic function of ``i``: an assistant reply (prose), or on every third step a
    tool output (source text); ``name`` carries the step's output, which the final result
    reads back.
    """
    corpus = _corpus()
    rng = random.Random(i)
    if i % 3 == 2:
        size = int(min(TOOL_CLIP[1], max(TOOL_CLIP[0], rng.lognormvariate(math.log(TOOL_MEDIAN), TOOL_SIGMA))))
        start = rng.randrange(len(corpus.source) - size)
        return {"role": "tool", "name": out, "content": corpus.source[start:start + size]}
    want = rng.randint(*REPLY_CHARS)
    k = rng.randrange(len(corpus.prose))
    parts: list[str] = []
    while sum(map(len, parts)) < want:
        parts.append(corpus.prose[k % len(corpus.prose)])
        k += 1
    return {"role": "assistant", "name": out, "content": " ".join(parts)[:want]}


def initial_state(regime: str) -> dict[str, Any]:
    """The agent's state before step 0."""
    if regime not in REGIMES:
        raise ValueError(f"unknown regime {regime!r}; one of {', '.join(REGIMES)}")
    state: dict[str, Any] = {"i": 0, "ok": True, "last": ""}
    if regime == "grow":
        state["transcript"] = []
    if regime == "mutate":
        state["memory"] = {}
    return state


def memory_slot(i: int) -> str:
    """Regime "mutate": the scratchpad slot step i rewrites."""
    return f"slot-{i % MEMORY_SLOTS}"


def scalar_update(state: dict[str, Any], i: int, out: str) -> dict[str, Any]:
    """The constant-size fields after step i returned ``out``: counter, check flag, last output."""
    ok = bool(state["ok"] and state["i"] == i and out_name(out) == f"out-{i}")
    return {"i": i + 1, "ok": ok, "last": out_name(out)}


def advance(state: dict[str, Any], i: int, out: str) -> dict[str, Any]:
    """Apply step i's result to ``state`` in place (and return it)."""
    state.update(scalar_update(state, i, out))
    if "transcript" in state:
        state["transcript"].append(out)
    if "memory" in state:
        state["memory"][memory_slot(i)] = out
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
        outputs = [entry["name"] for entry in state["transcript"]]
        ok = bool(state["ok"]) and len(outputs) == n
    elif "memory" in state:
        # regime "mutate": each slot holds the message of the last step that wrote it
        ok = bool(state["ok"]) and state["i"] == n and memory_ok(state["memory"], n)
        outputs = [fake_llm(i) for i in range(n)] if ok else []
    else:
        # regime "const": every output was checked on arrival, in order, against fake_llm(i)
        ok = bool(state["ok"]) and state["i"] == n
        outputs = [fake_llm(i) for i in range(n)] if ok else []
    if not ok:
        return {"n": state["i"], "digest": "MISMATCH"}
    return {"n": n, "digest": hashlib.sha256("|".join(outputs).encode()).hexdigest()[:16]}


def memory_ok(memory: dict[str, Any], n: int) -> bool:
    """Regime "mutate": after n steps, every slot holds the message of the last step that wrote it."""
    latest = {memory_slot(i): i for i in range(max(0, n - MEMORY_SLOTS), n)}
    return memory.keys() == latest.keys() and all(
        memory[slot] == transcript_entry(i, fake_llm(i)) for slot, i in latest.items())


def bare_per_step_s(n: int, regime: str, iters: int, effects_path: str | None = None) -> float:
    """Seconds per step of the agent loop with no framework at all (the floor)."""
    warm()
    fd = os.open(effects_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND) if effects_path else -1
    try:
        state = initial_state(regime)
        t = time.perf_counter()
        for i in range(n):
            busy_work(iters)
            out = fake_llm(i, regime)
            if fd >= 0:
                os.write(fd, b"%d\n" % i)
            state = advance(state, i, out)
        elapsed = time.perf_counter() - t
    finally:
        if fd >= 0:
            os.close(fd)
    assert final_result(state, n) == expected_result(n)
    return elapsed / n
