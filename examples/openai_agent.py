"""A research agent on an OpenAI-compatible API through the real `openai` client.

    python examples/openai_stub.py --port 0 --log /tmp/stub.jsonl   # prints PORT
    OPENAI_BASE_URL=http://127.0.0.1:PORT/v1 tcc run examples/openai_agent.py "durable execution"

Needs ``pip install openai``.  The loop is plan -> one answer per question ->
summary; every model call is a ``@tcc.effect``, so it is journaled and run
once, and the coroutine is snapshotted after it.  Kill the run at any moment
and ``tcc resume RUN_ID`` continues at the same loop position with the same
locals.  A call that was in flight at the kill is sent again with the *same*
``Idempotency-Key`` header (``tcc.current().idempotency_key``), so an API that
honours the header answers it once.

The client lives in a local of ``main`` wrapped in ``tcc.resource``: a
snapshot records "call openai.OpenAI(base_url=..., api_key=...) again", never
the live client with its sockets and locks.  The factory's arguments are
stored in every snapshot and journal entry that holds the client -- so with a
real key, leave out ``api_key`` and let the client read $OPENAI_API_KEY when it
is rebuilt, instead of passing the secret in.
"""

from __future__ import annotations

import os
from typing import Any

import openai

import tcc

MODEL = os.environ.get("OPENAI_MODEL", "gpt-4o-mini")
SYSTEM = {"role": "system", "content": "You are a concise research assistant."}


@tcc.effect
def chat(client: Any, prompt: str) -> str:
    """One model call (sync: tcc runs it in a worker thread)."""
    response = client.chat.completions.create(
        model=MODEL,
        messages=[SYSTEM, {"role": "user", "content": prompt}],
        # The same key on every attempt and on a re-issue after a crash.
        extra_headers={"Idempotency-Key": tcc.current().idempotency_key},
    )
    return response.choices[0].message.content or ""


async def main(topic: str = "durable execution", questions: str = "3") -> dict[str, Any]:
    client = tcc.resource(openai.OpenAI, base_url=os.environ["OPENAI_BASE_URL"], api_key="stub")
    plan = await chat(client, f"Plan: list {int(questions)} questions about {topic}")
    answers: list[dict[str, str]] = []
    for question in [line.strip() for line in plan.splitlines() if line.strip()]:
        answer = await chat(client, f"Answer in one paragraph: {question}")
        answers.append({"question": question, "answer": answer})
    notes = "\n".join(f"- {a['question']} {a['answer']}" for a in answers)
    summary = await chat(client, f"Summarise:\n{notes}")
    return {"topic": topic, "answers": answers, "summary": summary}


if __name__ == "__main__":  # not executed under `tcc run`
    print("run me with: OPENAI_BASE_URL=http://127.0.0.1:PORT/v1 tcc run examples/openai_agent.py [topic]")
