"""A run's error as stored (a JSON document) and read back for `tcc show`.

:func:`encode_error` runs in the process that drives the run, when the run
fails.  Besides the exception's type, message and formatted traceback it
records the agent's *frames* (file, line, function, source line), innermost
last, so that `tcc show` can say where the run failed without the source of
tcc's own driver in the way.

An exception an effect raised is thrown into the agent (``coro.throw``); its
``__traceback__`` then holds the driver's frames, the agent's frames up to the
``await`` and the effect's own frames (checked in tests/cli/test_show.py).
Frames of tcc's package are left out, and so are standard-library frames
that only connect two of tcc's (the driver's event loop running an effect),
unless that leaves nothing.

:func:`decode_error` reads any stored error blob (older ones without frames,
the verify check's ``{"type": "verify", ...}``, or non-JSON bytes) into one
shape; :func:`error_line` and :func:`traceback_lines` render it.
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any

MAX_FRAMES = 50
MAX_SOURCE = 200

_TCC_DIR = os.path.normcase(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep


@functools.cache
def _stdlib_dirs() -> tuple[str, ...]:
    # only a failed run needs them: sysconfig and traceback are not imported by every run
    import sysconfig

    paths = sysconfig.get_paths()
    return tuple(os.path.normcase(os.path.abspath(p)) + os.sep
                 for p in {paths.get("stdlib"), paths.get("platstdlib")} if p)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _message(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # noqa: BLE001 - a user __str__ failed; the run's failure is still recorded
        return f"<{type(exc).__name__} str() failed>"


def _is_tcc(filename: str) -> bool:
    return os.path.normcase(os.path.abspath(filename)).startswith(_TCC_DIR)


def _is_stdlib(filename: str) -> bool:
    if filename.startswith("<frozen "):
        return True
    return os.path.normcase(os.path.abspath(filename)).startswith(_stdlib_dirs())


def _with_traceback(exc: BaseException) -> BaseException:
    """``exc``, or for one that was never raised (the driver builds some, with the
    real exception as their cause), the first cause or context that was."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if cur.__traceback__ is not None:
            return cur
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return exc


def agent_frames(exc: BaseException) -> tuple[list[dict[str, Any]], int]:
    """The frames of ``exc``'s traceback to show, innermost last, and how many
    more (outer) frames the cap of :data:`MAX_FRAMES` left out."""
    import traceback

    summary = traceback.extract_tb(_with_traceback(exc).__traceback__)
    files = [f.filename for f in summary]
    tcc = [_is_tcc(name) for name in files]
    keep = []
    for i, name in enumerate(files):
        if tcc[i]:
            continue
        if _is_stdlib(name):
            # plumbing between two of tcc's frames (the driver's event loop): not the agent's
            before = next((tcc[j] for j in range(i - 1, -1, -1) if not _is_stdlib(files[j])), False)
            after = next((tcc[j] for j in range(i + 1, len(files)) if not _is_stdlib(files[j])), False)
            if before and after:
                continue
        keep.append(i)
    if not keep:  # the failure is in tcc itself (or nothing is left): show it all
        keep = list(range(len(summary)))
    omitted = max(0, len(keep) - MAX_FRAMES)
    frames = [
        {
            "file": summary[i].filename,
            "line": summary[i].lineno,
            "function": summary[i].name,
            "source": _clip((summary[i].line or "").strip(), MAX_SOURCE),
        }
        for i in keep[omitted:]
    ]
    return frames, omitted


def encode_error(exc: BaseException) -> bytes:
    """The stored form of a run's error: type, message, traceback text and frames."""
    import traceback

    try:
        text = "".join(traceback.format_exception(exc))
    except Exception as failed:  # noqa: BLE001 - formatting must not lose the failure
        text = f"<traceback could not be formatted: {type(failed).__name__}>"
    frames, omitted = agent_frames(exc)
    doc: dict[str, Any] = {
        "type": f"{type(exc).__module__}.{type(exc).__qualname__}",
        "message": _message(exc),
        "traceback": text,
        "frames": frames,
    }
    if omitted:
        doc["frames_omitted"] = omitted
    return json.dumps(doc).encode()


# ---------------------------------------------------------------- reading


def decode_error(blob: bytes | None) -> dict[str, Any] | None:
    """A stored error as ``{"type", "message", "frames", "frames_omitted", "traceback"}``
    (None if there is none; ``type`` is "" for an error stored as plain text).
    Never fails: unknown shapes keep what they have."""
    if not blob:
        return None
    try:
        doc = json.loads(blob)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        text = bytes(blob).decode(errors="replace")
        return {"type": "", "message": text, "frames": [],
                "frames_omitted": 0, "traceback": None}
    frames = []
    for f in doc.get("frames") or []:
        if isinstance(f, dict):
            frames.append({"file": str(f.get("file", "?")), "line": f.get("line"),
                           "function": str(f.get("function", "?")), "source": str(f.get("source") or "")})
    omitted = doc.get("frames_omitted")
    return {
        "type": str(doc.get("type", "Error")),
        "message": str(doc.get("message", "")),
        "frames": frames,
        "frames_omitted": omitted if isinstance(omitted, int) else 0,
        "traceback": doc.get("traceback") if isinstance(doc.get("traceback"), str) else None,
    }


def error_line(error: dict[str, Any]) -> str:
    """``KeyError: 'missing_key'``: the short name of the type and the message
    (just the text of an error that was stored as plain bytes)."""
    if not error["type"]:
        return str(error["message"])
    name = error["type"].rpartition(".")[2]
    return f"{name}: {error['message']}"


def traceback_lines(error: dict[str, Any]) -> list[str]:
    """The frames as Python prints a traceback, ending with the error line
    (no lines if no frames were recorded)."""
    if not error["frames"]:
        return []
    lines = ["Traceback (most recent call last):"]
    if error["frames_omitted"]:
        lines.append(f"  … {error['frames_omitted']} earlier frames")
    previous, repeated = None, 0
    for f in error["frames"]:
        same = (f["file"], f["line"], f["function"])
        if same == previous:
            repeated += 1
            if repeated > 2:  # deep recursion: as Python prints it
                continue
        else:
            if repeated > 2:
                lines.append(f"  [Previous line repeated {repeated - 2} more times]")
            previous, repeated = same, 0
        lines.append(f'  File "{f["file"]}", line {f["line"]}, in {f["function"]}')
        if f["source"]:
            lines.append(f"    {f['source']}")
    if repeated > 2:
        lines.append(f"  [Previous line repeated {repeated - 2} more times]")
    lines.append(error_line(error))
    return lines
