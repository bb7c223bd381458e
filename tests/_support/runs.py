"""Run the tcc CLI in subprocesses against a private store."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from typing import Any

AGENTS = pathlib.Path(__file__).resolve().parent / "agents"


class Cli:
    def __init__(self, tmp: pathlib.Path, **env: str) -> None:
        self.store = tmp / "store"
        self.env = dict(os.environ, TCC_STORE=str(self.store), **env)

    def cmd(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "tcc", *args]

    def run(self, *args: str, timeout: float = 120, check: bool = False) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(self.cmd(*args), env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"tcc {' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
        return proc

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.cmd(*args), env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    def show(self, run_id: str) -> dict[str, Any]:
        out = self.run("show", "--json", run_id, check=True)
        return json.loads(out.stdout)
