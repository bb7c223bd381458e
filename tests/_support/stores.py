"""Helpers shared by the store tests: deterministic payloads and a fresh-interpreter runner."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap

def payload(n: int, size: int = 3000) -> bytes:
    """Deterministic, incompressible-ish bytes distinct for each ``n``."""

    out = bytearray()
    block = 0
    while len(out) < size:
        out += hashlib.blake2b(f"{n}:{block}".encode(), digest_size=64).digest()
        block += 1
    return bytes(out[:size])


def run_python(code: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (same venv) and return the finished process."""
    env = {**os.environ, "PYTHONFAULTHANDLER": "1"}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True, text=True, timeout=timeout, env=env,
    )
