"""A real ``tcc ui`` process for tests: started on a free port, stopped whatever happens.

:func:`running_ui` starts ``python -m tcc ui --port 0`` on a store, reads the URL with the
access token from its first stdout line, and yields a :class:`Ui` that makes HTTP
requests to it (plain ``urllib``: the server is the real one, reached over TCP).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any, Iterator
from urllib.parse import urlsplit

AGENT = os.path.join(os.path.dirname(__file__), "agents", "ui_agent.py")


@dataclasses.dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode()


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


@dataclasses.dataclass
class Ui:
    url: str  # as printed: http://127.0.0.1:PORT/?token=...
    proc: subprocess.Popen[str]

    @property
    def base(self) -> str:
        parts = urlsplit(self.url)
        return f"{parts.scheme}://{parts.netloc}"

    @property
    def cookie(self) -> str:
        """The name of the cookie that holds the token (one per port)."""
        return f"tcc_ui_token_{urlsplit(self.url).port}"

    @property
    def token(self) -> str:
        return self.url.split("token=", 1)[1]

    def request(self, method: str, path: str, *, body: Any = None, raw: bytes | None = None,
                token: str | None = "header", headers: dict[str, str] | None = None) -> Answer:
        """``token``: "header" (Authorization), "query", "cookie", None (none sent), or any
        other string: sent as a wrong token in the header."""
        hdrs = dict(headers or {})
        url = self.base + path
        if token == "header":
            hdrs["Authorization"] = f"token {self.token}"
        elif token == "query":
            url += ("&" if "?" in url else "?") + f"token={self.token}"
        elif token == "cookie":
            hdrs["Cookie"] = f"{self.cookie}={self.token}"
        elif token is not None:
            hdrs["Authorization"] = f"token {token}"
        data = raw
        if body is not None:
            data = json.dumps(body).encode()
            hdrs.setdefault("Content-Type", "application/json")
        req = urllib.request.Request(url, data=data, method=method, headers=hdrs)
        try:
            with _OPENER.open(req, timeout=30) as resp:
                return Answer(resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read())
        except urllib.error.HTTPError as exc:
            return Answer(exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read())

    def get(self, path: str, **kw: Any) -> Answer:
        return self.request("GET", path, **kw)

    def post(self, path: str, body: Any = None, **kw: Any) -> Answer:
        return self.request("POST", path, body=body, **kw)


@contextlib.contextmanager
def running_ui(store: str, *, env: dict[str, str] | None = None, extra: tuple[str, ...] = (),
               cwd: str | None = None) -> Iterator[Ui]:
    """``tcc ui --store STORE --port 0`` in a subprocess, stopped (SIGTERM, then SIGKILL)
    when the block ends, whatever happens in it."""
    cmd = [sys.executable, "-m", "tcc", "ui", "--store", store, "--port", "0", *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, **(env or {})), cwd=cwd)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if not line.startswith("http://"):
            proc.kill()
            _, err = proc.communicate(timeout=30)
            raise AssertionError(f"tcc ui did not print its URL: {line!r} {err}")
        ui = Ui(line, proc)
        deadline = time.monotonic() + 30
        while True:  # the URL is printed just before uvicorn starts serving
            try:
                ui.get("/static/app.css")
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield ui
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def tcc(*args: str, env: dict[str, str] | None = None, check: bool = True,
        cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([sys.executable, "-m", "tcc", *args], capture_output=True, text=True,
                         env=dict(os.environ, **(env or {})), timeout=120, cwd=cwd)
    if check and out.returncode != 0:
        raise AssertionError(f"tcc {' '.join(args)} exited {out.returncode}: {out.stderr}")
    return out


def parked_run(store: str, *, func: str = "gated", env: dict[str, str] | None = None,
               args: tuple[str, ...] = ("hello",)) -> str:
    """Start the UI test agent's ``func`` with ``tcc run --json``; return the run id."""
    out = tcc("run", "--json", "--store", store, f"{AGENT}:{func}", *args, env=env)
    return str(json.loads(out.stdout)["id"])
