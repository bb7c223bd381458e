"""Demo: an agent is killed mid-run and resumed in a new process.

1. Run the agent uninterrupted, for reference.
2. Run it again in a child process that snapshots the live coroutine after
   every step (tcc.dumps) and is SIGKILLed by itself after step 3.
3. A fresh process loads the last snapshot (tcc.loads) and finishes the run
   from the exact instruction where it stopped: nothing is replayed.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import tempfile

import tcc


class Ask:
    """A request the driver answers (stands in for an LLM or tool call)."""

    def __init__(self, tool: str, arg: str) -> None:
        self.tool, self.arg = tool, arg

    def __await__(self):  # type: ignore[no-untyped-def]
        return (yield self)


def fake_llm(tool: str, arg: str) -> str:
    """A deterministic stand-in for the model and tools."""
    if tool == "plan":
        return "history,methods,results"
    return f"{tool}({arg})->{sum(map(ord, arg)) % 97}"


async def research(topic: str) -> dict[str, object]:
    notes: list[str] = []
    plan = await Ask("plan", topic)
    for i, question in enumerate(plan.split(",")):
        notes.append(await Ask("search", f"{topic}/{question}"))
        if i % 2 == 0:
            notes[-1] = notes[-1].upper()
    summary = await Ask("summarise", " ".join(notes))
    return {"topic": topic, "notes": notes, "summary": summary}


def drive(task, reply=None, snapshot: pathlib.Path | None = None, die_after: int | None = None,
          steps: int = 0):
    try:
        while True:
            req = task.send(reply)
            steps += 1
            print(f"  step {steps}: {req.tool}({req.arg!r})", flush=True)
            reply = fake_llm(req.tool, req.arg)
            if snapshot is not None:
                tmp = snapshot.with_suffix(".tmp")
                tmp.write_bytes(tcc.dumps((task, reply, steps)))
                os.replace(tmp, snapshot)
            if die_after is not None and steps == die_after:
                print("  ** SIGKILL **", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
    except StopIteration as stop:
        return stop.value


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--crash":
        drive(research("continuations"), snapshot=pathlib.Path(sys.argv[2]), die_after=3)
        return 0
    if len(sys.argv) == 3 and sys.argv[1] == "--resume":
        task, reply, steps = tcc.loads(pathlib.Path(sys.argv[2]).read_bytes())
        print(repr(drive(task, reply, steps=steps)))
        return 0

    print("uninterrupted run:")
    expected = drive(research("continuations"))
    with tempfile.TemporaryDirectory() as tmp:
        snap = pathlib.Path(tmp) / "agent.snap"
        print("run that is killed after step 3:")
        crashed = subprocess.run([sys.executable, __file__, "--crash", str(snap)])
        print(f"  process exited with {crashed.returncode} (SIGKILL = -9); "
              f"snapshot is {snap.stat().st_size} bytes")
        print("resumed in a new process from the snapshot:")
        resumed = subprocess.run(
            [sys.executable, __file__, "--resume", str(snap)], capture_output=True, text=True
        )
        sys.stdout.write("".join(l + "\n" for l in resumed.stdout.splitlines()[:-1]))
        result = resumed.stdout.strip().splitlines()[-1]
    same = result == repr(expected)
    print(f"result: {result}")
    print(f"matches the uninterrupted run: {same}")
    return 0 if same and crashed.returncode == -signal.SIGKILL else 1


if __name__ == "__main__":
    sys.exit(main())
