"""The interpreter's standard streams are captured by reference; other open files are refused."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap

import tcc
from tcc.capture import _pickler

SCRIPT = textwrap.dedent(
    '''
    import io, os, sys
    import tcc

    def log(msg, file=sys.stderr):
        print(msg, file=file)

    class Ask:
        def __init__(self, what):
            self.what = what
        def __await__(self):
            return (yield self)

    async def agent():
        out, original, inp = sys.stdout, sys.__stdout__, sys.stdin
        log("before")
        reply = await Ask("go")
        log("after " + reply)
        print("out " + reply, file=out)
        print("original " + reply, file=original)
        return inp is sys.stdin

    if __name__ == "__main__":
        task = agent()
        task.send(None)
        open(sys.argv[1], "wb").write(tcc.dumps(task))
        # The same file descriptor under another file object is an ordinary open file.
        other = os.fdopen(sys.stdout.fileno(), "w", closefd=False)
        async def holds_other():
            f = other
            await Ask("x")
            return f
        held = holds_other()
        held.send(None)
        try:
            tcc.dumps(held)
        except tcc.CaptureError as exc:
            print("REFUSED", exc)
        held.close()
    '''
)

RESUME = textwrap.dedent(
    '''
    import io, json, sys, tcc
    out, err = io.StringIO(), io.StringIO()
    real_out = sys.stdout
    sys.stdout, sys.stderr = out, err
    task = tcc.loads(open(sys.argv[1], "rb").read())
    try:
        task.send("yes")
    except StopIteration as stop:
        same_stdin = stop.value
    sys.stdout, sys.stderr = real_out, sys.__stderr__
    print(json.dumps({"out": out.getvalue(), "err": err.getvalue(), "stdin": same_stdin}))
    '''
)


def test_standard_streams_are_restored_as_the_loading_process_streams(tmp_path):
    """A script helper defaulting to sys.stderr is captured, and writes to the loader's stderr."""
    script = tmp_path / "streams_agent.py"
    script.write_text(SCRIPT)
    blob = tmp_path / "snap.bin"
    first = subprocess.run(
        [sys.executable, str(script), str(blob)], capture_output=True, text=True, timeout=120
    )
    assert first.returncode == 0, first.stderr
    assert first.stderr == "before\n"
    assert "REFUSED" in first.stdout and "local 'f'" in first.stdout
    assert "open files cannot be captured" in first.stdout
    second = subprocess.run(
        [sys.executable, "-c", RESUME, str(blob)], capture_output=True, text=True, timeout=120
    )
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout) == {
        "out": "out yes\noriginal yes\n",
        "err": "after yes\n",
        "stdin": True,
    }


def test_a_reducer_registered_for_files_does_not_take_the_standard_streams(tmp_path):
    """A user's reducer for text files rebuilds other files but leaves sys.stderr by reference."""
    try:
        tcc.register_reducer(io.TextIOWrapper, lambda f: (str, (f"reopened {f.name}",)))
        with open(tmp_path / "notes.txt", "w") as notes:
            stderr, other = tcc.loads(tcc.dumps([sys.__stderr__, notes]))
    finally:
        _pickler._REGISTRY.pop(io.TextIOWrapper, None)
        _pickler._KIND_CACHE.clear()
    assert stderr is sys.stderr
    assert other == f"reopened {tmp_path / 'notes.txt'}"
