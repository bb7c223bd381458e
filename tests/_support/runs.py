"""Run the tcc CLI in subprocesses against a private store.

By default the store is the LMDB directory ``tmp/store``.  ``Cli(tmp, store_url=URL,
key_file=PATH)`` points the commands at a PostgreSQL store instead (``TCC_STORE`` and
``TCC_STORE_KEY_FILE`` in their environment; see tests/_support/pgstores.py).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from typing import Any

AGENTS = pathlib.Path(__file__).resolve().parent / "agents"


class Cli:
    def __init__(self, tmp: pathlib.Path, *, store_url: str | None = None,
                 key_file: str | None = None, **env: str) -> None:
        self.store: pathlib.Path | str = tmp / "store" if store_url is None else store_url
        self.key_file = key_file
        self.env = dict(os.environ, TCC_STORE=str(self.store), **env)
        if key_file is not None:  # the store's key file, and no other key
            self.env.pop("TCC_STORE_KEY", None)
            self.env["TCC_STORE_KEY_FILE"] = key_file

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
