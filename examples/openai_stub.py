"""A tiny OpenAI-compatible stub server for examples/openai_agent.py (stdlib only).

    python examples/openai_stub.py --port 0 --log /tmp/stub.jsonl [--delay 0.2]

prints the port it listens on (127.0.0.1 only) and serves
``POST /v1/chat/completions`` until interrupted.  The reply is a valid
``chat.completion`` whose content is a deterministic function of the request
messages, so an interrupted-and-resumed agent gets the same answers as an
uninterrupted one.  Every request is appended to the log file (``--log``, or
$OPENAI_STUB_LOG) as one JSON line with its ``Idempotency-Key`` header, when
it arrives.  A repeated key gets the response stored for it, like a real API
that honours idempotency keys.

Tests import it: ``with StubServer(log=path, delay=0.2) as stub: stub.base_url``.
"""

from __future__ import annotations

import argparse
import hashlib
import http.server
import json
import os
import re
import sys
import threading
from typing import Any

ASPECTS = ("history", "core mechanism", "failure modes", "trade-offs", "open problems", "tooling")


def digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:10]


def reply_for(messages: list[dict[str, Any]]) -> str:
    """The assistant's answer: a pure function of the request messages."""
    last = next((m for m in reversed(messages) if m.get("role") == "user"), {"content": ""})
    text = last.get("content") or ""
    if not isinstance(text, str):  # list-of-parts content
        text = " ".join(part.get("text", "") for part in text if isinstance(part, dict))
    plan = re.match(r"Plan: list (\d+) questions about (.+)", text, re.S)
    if plan:
        count, topic = min(int(plan.group(1)), len(ASPECTS)), plan.group(2).strip()
        return "\n".join(f"What about the {aspect} of {topic}?" for aspect in ASPECTS[:count])
    if text.startswith("Summarise:"):
        return f"Summary [{digest(messages)}]: {text.count(chr(10))} answers reviewed."
    return f"Answer [{digest(messages)}] to: {text.splitlines()[0] if text else ''}"


def completion(model: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    content = reply_for(messages)
    prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in messages)
    completion_tokens = len(content.split())
    return {
        "id": f"chatcmpl-stub-{digest(messages)}",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": model,
        "system_fingerprint": "fp_stub",
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": content, "refusal": None},
            "logprobs": None,
            "finish_reason": "stop",
        }],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


class _Handler(http.server.BaseHTTPRequestHandler):
    server: "_Server"

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        if self.path.rstrip("/") != "/v1/chat/completions":
            self._send(404, {"error": {"message": f"no route {self.path}", "type": "invalid_request_error"}})
            return
        try:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            messages = body["messages"]
            model = str(body.get("model", "stub"))
        except (ValueError, KeyError, TypeError) as exc:
            self._send(400, {"error": {"message": f"bad request: {exc}", "type": "invalid_request_error"}})
            return
        key = self.headers.get("Idempotency-Key")
        stub = self.server.stub
        doc, repeat = stub.record(key, model, messages)
        if stub.delay:
            threading.Event().wait(stub.delay)  # a slow model: time for a kill to land in flight
        self._send(200, doc, repeat=repeat)

    def _send(self, status: int, doc: dict[str, Any], repeat: bool = False) -> None:
        data = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if repeat:
            self.send_header("Idempotent-Replayed", "true")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass  # the JSON log file is the record


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    stub: "StubServer"

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):
            return  # the client was killed mid-request: expected in crash tests
        super().handle_error(request, client_address)


class StubServer:
    """The stub on 127.0.0.1; ``with StubServer(...) as stub`` serves in a thread."""

    def __init__(self, port: int = 0, log: str | None = None, delay: float = 0.0) -> None:
        self.log = log if log is not None else os.environ.get("OPENAI_STUB_LOG")
        self.delay = delay
        self._lock = threading.Lock()
        self._responses: dict[str, dict[str, Any]] = {}
        self.requests = 0
        self._httpd = _Server(("127.0.0.1", port), _Handler)
        self._httpd.stub = self
        self.port: int = self._httpd.server_address[1]
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def record(self, key: str | None, model: str, messages: list[dict[str, Any]]) -> tuple[dict[str, Any], bool]:
        """Log one request and return (response document, whether its key was seen before)."""
        with self._lock:
            self.requests += 1
            repeat = key is not None and key in self._responses
            doc = self._responses[key] if repeat and key is not None else completion(model, messages)
            if key is not None:
                self._responses[key] = doc
            if self.log:
                line = {"n": self.requests, "idempotency_key": key, "repeat": repeat,
                        "model": model, "messages": digest(messages)}
                with open(self.log, "a") as fh:
                    fh.write(json.dumps(line) + "\n")
            return doc, repeat

    def serve_forever(self) -> None:
        self._httpd.serve_forever(poll_interval=0.05)

    def start(self) -> "StubServer":
        self._thread = threading.Thread(target=self.serve_forever, name="openai-stub", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join()
            self._thread = None
        self._httpd.server_close()

    def __enter__(self) -> "StubServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: pick a free one)")
    parser.add_argument("--log", default=None, help="JSON-lines request log (default: $OPENAI_STUB_LOG)")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds to wait before each reply")
    args = parser.parse_args(argv)
    stub = StubServer(args.port, args.log, args.delay)
    print(stub.port, flush=True)
    print(f"export OPENAI_BASE_URL={stub.base_url}", file=sys.stderr, flush=True)
    try:
        stub.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        stub.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
