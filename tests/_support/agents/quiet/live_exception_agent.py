"""An effect raises an exception that carries an attribute that cannot be captured (an HTTP
error holding its live response).  The agent catches it by its class on every path: it used
to fail the run at the next checkpoint uninterrupted, and to get a RuntimeError stand-in
(which `except HTTPError` does not catch) when the call was served from the journal."""

import json
import os
import threading

import tcc


class HTTPError(Exception):
    def __init__(self, msg, response):
        super().__init__(msg)
        self.response = response

class Response:
    def __init__(self, status):
        self.status = status
        self._lock = threading.Lock()     # a live connection pool, say

@tcc.effect
def get(url: str) -> str:
    with open(os.environ.get("LEDGER", "/dev/null"), "a") as f:
        f.write(json.dumps({"url": url, "key": tcc.current().idempotency_key}) + "\n")
    if "bad" in url:
        raise HTTPError(f"503 for {url}", Response(503))
    return f"body of {url}"

async def main():
    out = []
    for url in ["a", "bad1", "b", "c"]:
        try:
            out.append(await get(url))
        except HTTPError as e:
            dropped = any("dropped: response" in note for note in getattr(e, "__notes__", ()))
            out.append(f"error {e} response={getattr(e, 'response', None)} noted={dropped}")
    return out
