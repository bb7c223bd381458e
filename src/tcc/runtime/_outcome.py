"""How a run record stores the end of a run, and how that is read back.

- ``result``: JSON ``{"value": v}``, or ``{"repr": repr(v)}`` for a value JSON cannot hold.
- ``error``: the JSON document of :func:`encode_error` (type, message, traceback text and
  the agent's frames; built in runtime/_report.py), or ``{"type": "verify", "message":
  evidence}`` for a result the run's verify check rejected; ``b""`` clears an earlier
  error (a failed run that a retry completed).

These bytes are part of the store's format: `tcc show` decodes them, and so does a parent
run for the outcome of a child it spawned (:func:`decode_child`).
"""

from __future__ import annotations

import json
from typing import Any

from .. import errors
from ..store import RETURNED_STATUSES, RunInfo
from ._report import decode_error as decode_error
from ._report import encode_error as encode_error
from ._report import error_line as error_line
from ._report import traceback_lines as traceback_lines
from ._state import Resumption


def encode_result(value: Any) -> bytes:
    """The stored form of a run's result."""
    try:
        return json.dumps({"value": value}).encode()
    except (TypeError, ValueError):
        return json.dumps({"repr": repr(value)}).encode()


def _result_value(doc: dict[str, Any]) -> Any:
    return doc["value"] if "value" in doc else doc.get("repr")


def decode_result(blob: bytes | None) -> Any:
    """A stored result: the value, or the repr of a value JSON could not hold (None if
    there is none; the repr of the bytes if they are not JSON)."""
    if not blob:
        return None
    try:
        doc = json.loads(blob)
    except ValueError:
        return repr(blob)
    return _result_value(doc)


def encode_verify_failure(evidence: str) -> bytes:
    """The stored error of a run whose result its verify check rejected."""
    return json.dumps({"type": "verify", "message": evidence}).encode()


def decode_child(run: RunInfo) -> Resumption:
    """What a finished child run sends into the parent that awaits its ``tcc.spawn``: its
    result, or RunFailedError with its error's message."""
    if run.status in RETURNED_STATUSES:
        return ("send", _result_value(json.loads(run.result or b"{}")))
    message = json.loads(run.error or b"{}").get("message", run.status)
    return ("throw", errors.RunFailedError(f"child run {run.run_id} {run.status}: {message}"))
