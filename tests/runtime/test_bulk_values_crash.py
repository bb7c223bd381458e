"""Large buffers and long lists travel out of band (``tcc.capture._framed``) and survive a
SIGKILL: the resumed run ends with what an uninterrupted one does, every value of its
type, and every reference to one object still to that object."""

from __future__ import annotations

import json
import signal

import pytest

from tcc.capture import native_available
from tests._support.runs import AGENTS, Cli

pytestmark = pytest.mark.skipif(not native_available(), reason="needs the native module")

AGENT = str(AGENTS / "bulk_agent.py")


def test_a_run_killed_mid_transcript_resumes_to_the_uninterrupted_result(tmp_path):
    whole = Cli(tmp_path / "whole")
    expected = json.loads(whole.run("run", "--json", "--run-id", "w", AGENT, check=True).stdout)
    assert expected["result"]["n"] == 700 and expected["result"]["shared"] is True
    assert expected["result"]["types"] == ["bytes", "bytearray", "bytes"]

    killed = Cli(tmp_path / "killed", KILL_AT="650")
    proc = killed.run("run", "--run-id", "k", AGENT)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    shown = killed.show("k")
    assert shown["status"] == "running" and shown["snapshots"], shown
    resumed = Cli(tmp_path / "killed")  # the same store, no kill this time
    done = json.loads(resumed.run("resume", "--json", "k", check=True).stdout)
    assert done["result"] == expected["result"]


def test_the_frozen_stack_shows_out_of_band_values_without_running_user_code(tmp_path):
    cli = Cli(tmp_path, KILL_AT="600")
    assert cli.run("run", "--run-id", "k", AGENT).returncode == -signal.SIGKILL
    doc = json.loads(cli.run("inspect", "--json", "k", check=True).stdout)
    frame = next(f for f in doc["frames"] if f["function"] == "main")
    local = frame["locals"]  # name -> safe repr
    assert local["blob"].startswith("b'\\x19\\xb2") and local["held"].startswith("[b'\\x19")
    assert local["buf"].startswith("bytearray(b'")
    assert local["small"] == repr(b"small" * 10)
    assert local["transcript"].startswith("[{'content': 'reply 0', 'i': 0")
    assert local["i"] == "599"
