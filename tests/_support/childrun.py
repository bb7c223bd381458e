"""Run code in fresh child interpreters with the test programs importable.

The child gets the repository root on ``PYTHONPATH``, so it imports the programs as
``tests._support.programs`` -- the name their functions are pickled by in the parent.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from tests._support import ROOT


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.pop("PYTHONHASHSEED", None)
    return env


def run_child(
    code: str, *args: str, timeout: float = 300, flags: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """Run Python code in a fresh interpreter with the programs importable."""
    return subprocess.run(
        [sys.executable, *flags, "-c", code, *args],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_child_json(code: str, *args: str) -> Any:
    proc = run_child(code, *args)
    assert proc.returncode == 0, f"child failed ({proc.returncode}):\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1])

