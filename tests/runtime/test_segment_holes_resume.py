"""A transcript whose messages are also held elsewhere, killed with SIGKILL mid-run and
resumed: the sharing and the in-place changes survive, as in an uninterrupted run.

A long list's snapshot segments leave out the items they cannot stand for (a system prompt
kept in a local, a list among the messages) and pickle them with the rest of the state
(``tcc.capture._segments``, "holes"); this is the end-to-end check of that, across a real
crash."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tcc.capture import native_available

pytestmark = pytest.mark.skipif(not native_available(), reason="needs the native module")

_AGENT = '''
import hashlib, json, os, signal
import tcc

@tcc.effect(name="reply")
def reply(i):
    if i == int(os.environ.get("KILL_AT", "-1")):
        os.kill(os.getpid(), signal.SIGKILL)  # inside the effect: its intent is journaled
    return {"role": "assistant", "content": f"reply {i} " * 20}

async def main():
    system = {"role": "system", "content": "be brief"}
    scratch = []
    prefill = int(os.environ.get("PREFILL", "0"))  # older messages, present from the start
    transcript = [system, scratch] + [{"role": "user", "content": f"old {j} " * 20} for j in range(prefill)]
    for i in range(300):
        msg = await reply(i)
        if os.environ.get("REBUILD"):
            transcript = transcript + [msg]  # a new list at every step
        else:
            transcript.append(msg)
        system["turns"] = i + 1  # changed in place through the local
        scratch.append(i)  # and through this one
        if i == 150:
            transcript[40]["edited"] = True  # an old message, changed in place
    return {
        "system is the first message": transcript[0] is system,
        "scratch is the second": transcript[1] is scratch,
        "turns": transcript[0]["turns"],
        "scratch": len(transcript[1]),
        "n": len(transcript),
        "digest": hashlib.sha256(json.dumps(transcript, sort_keys=True).encode()).hexdigest()[:16],
    }
'''


def _tcc(env, *args):
    return subprocess.run([sys.executable, "-m", "tcc", *args], env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("kill_at,rebuild,prefill", [(120, "", 0), (260, "", 0), (200, "1", 0),
                                                      (100, "", 2000)])
def test_a_resumed_transcript_keeps_its_shared_messages(tmp_path, kill_at, rebuild, prefill):
    """``rebuild``: the agent writes ``transcript = transcript + [msg]``, and each new list
    takes over the segments of the one before (``SegmentCache._adopt``).  ``prefill``: the
    transcript passes 2,048 messages at step 46, where its first segments give way to one of
    2,048 (``_segments.LARGE_SEGMENT``), before the kill."""
    script = tmp_path / "agent.py"
    script.write_text(_AGENT)
    env = {**os.environ, "TCC_STORE": str(tmp_path / "store"), "REBUILD": rebuild,
           "PREFILL": str(prefill)}
    whole = _tcc(env, "run", "--json", "--run-id", "whole", str(script))
    assert whole.returncode == 0, whole.stderr
    expected = json.loads(whole.stdout)["result"]
    assert expected["system is the first message"] and expected["scratch is the second"]
    assert (expected["turns"], expected["scratch"], expected["n"]) == (300, 300, 302 + prefill)

    killed = _tcc({**env, "KILL_AT": str(kill_at)}, "run", "--run-id", "r", str(script))
    assert killed.returncode == -9, killed.stderr  # SIGKILLed inside step kill_at
    resumed = _tcc(env, "resume", "--json", "r")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["result"] == expected
