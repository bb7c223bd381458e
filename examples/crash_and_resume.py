"""The quick start's main job: an agent is SIGKILLed mid-run and resumed.

1. `tcc run` the research agent once, uninterrupted, for reference.
2. `tcc run` it again, slowed down, and `kill -9` it after its third effect.
3. `tcc show` the dead run, then `tcc resume` it: the resumed process continues
   from the newest snapshot -- same locals, same loop position -- and does not
   repeat finished effects.
4. Compare the results and print the side-effect ledger.

Uses the embedded LMDB store in ./.tcc (or $TCC_STORE).  Exits 1 on mismatch.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time
import uuid

AGENT = str(pathlib.Path(__file__).resolve().parent / "research_agent.py")
TOPIC = "durable agents"


def tcc(*args: str, env: dict[str, str] | None = None, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tcc", *args], env=env, text=True, **kw)


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="tcc-demo-") as scratch:  # removed however it ends
        return demo(pathlib.Path(scratch) / "ledger.txt")


def demo(ledger: pathlib.Path) -> int:
    env = dict(os.environ, AGENT_LEDGER=str(ledger))

    print("$ tcc run examples/research_agent.py  # uninterrupted reference")
    ref = tcc("run", "--json", AGENT, TOPIC, capture_output=True, env=env, check=True)
    expected = json.loads(ref.stdout)["result"]
    ledger.unlink()

    run_id = "demo-" + uuid.uuid4().hex[:8]
    print(f"\n$ tcc run --run-id {run_id} examples/research_agent.py  # killed after 3 effects")
    slow = dict(env, AGENT_DELAY="0.4")
    proc = subprocess.Popen([sys.executable, "-m", "tcc", "run", "--run-id", run_id, AGENT, TOPIC],
                            env=slow, text=True)
    try:
        while not ledger.exists() or len(ledger.read_text().splitlines()) < 3:
            if proc.poll() is not None:
                print("the run ended before it could be killed", file=sys.stderr)
                return 1
            time.sleep(0.02)
    finally:  # killed here as planned, or because the demo itself stopped (Ctrl-C)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    print(f"  ** kill -9 ** (exit status {proc.returncode})")

    print(f"\n$ tcc show {run_id}")
    tcc("show", run_id, env=env, check=True)

    print(f"\n$ tcc resume {run_id}")
    resumed = tcc("resume", "--json", run_id, capture_output=True, env=env, check=True)
    doc = json.loads(resumed.stdout)
    print(f"  status {doc['status']}; {doc['effects']} effect(s) executed after the crash, "
          f"{doc['replayed']} served from the journal")

    lines = ledger.read_text().splitlines()
    print("\nside-effect ledger (effect, idempotency key):")
    for line in lines:
        print("  " + " ".join(line.split()[:2]))
    keys = [line.split()[1] for line in lines]
    duplicates = len(keys) - len(set(keys))
    same = doc["result"] == expected
    print(f"\nresult: {json.dumps(doc['result'])}")
    print(f"matches the uninterrupted run: {same}")
    print(f"effects repeated after the crash: {duplicates} "
          "(only a call in flight at the kill may repeat, with the same idempotency key)")
    return 0 if same and doc["status"] == "completed" and duplicates <= 1 else 1


if __name__ == "__main__":
    sys.exit(main())
