"""A research agent with a deterministic fake LLM and tools (runs offline).

    tcc run examples/research_agent.py "durable execution"

Every LLM and tool call is a tcc effect: journaled, run once, and followed by
a snapshot of the live coroutine chain, so a crash (kill -9, OOM) at any
moment resumes here -- same locals, same loop position -- with `tcc resume`.
Set AGENT_LEDGER to a file path to log each side effect (the crash demo
checks it); AGENT_DELAY slows the tools down so there is time to kill it.
"""

from __future__ import annotations

import hashlib
import os
import time

import tcc

DELAY = float(os.environ.get("AGENT_DELAY", "0"))


def _ledger(line: str) -> None:
    path = os.environ.get("AGENT_LEDGER")
    if path:
        with open(path, "a") as fh:
            fh.write(line + "\n")


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:8]


@tcc.effect
async def llm(prompt: str) -> str:
    """A fake model: deterministic text derived from the prompt."""
    time.sleep(DELAY)
    _ledger(f"llm {tcc.current().idempotency_key} {_digest(prompt)}")
    if prompt.startswith("plan:"):
        topic = prompt[5:].strip()
        return "\n".join(f"{topic} {aspect}" for aspect in ("history", "methods", "limits", "outlook"))
    return f"summary[{_digest(prompt)}]"


@tcc.effect(retries=2)
def search(query: str) -> list[str]:
    """A fake search tool (sync: called directly; with a timeout it would run in a thread)."""
    time.sleep(DELAY)
    _ledger(f"search {tcc.current().idempotency_key} {query}")
    return [f"{query} result {i} ({_digest(query + str(i))})" for i in range(3)]


async def plan(topic: str) -> list[str]:
    # A plain helper coroutine: no decorator needed to be captured.
    return (await llm(f"plan: {topic}")).splitlines()


async def main(topic: str = "continuations") -> dict[str, object]:
    notes: list[str] = []
    questions = await plan(topic)
    for i, question in enumerate(questions):
        hits = await search(question)
        best = max(hits, key=len)
        notes.append(f"{i}: {best}")
        if i % 2 == 1:
            await tcc.checkpoint()
    summary = await llm("summarise: " + " | ".join(notes))
    return {"topic": topic, "notes": notes, "summary": summary}


if __name__ == "__main__":  # not executed under `tcc run`
    print("run me with: tcc run examples/research_agent.py [topic]")
