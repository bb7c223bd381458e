"""Functions of a script run as __main__ are captured by value and resume elsewhere."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    '''
    import sys
    import tcc

    class Ask:
        def __init__(self, what):
            self.what = what
        def __await__(self):
            return (yield self)

    def make_counter():
        count = 0
        def bump():
            nonlocal count
            count += 1
            return count
        return bump

    async def agent(topic):
        bump = make_counter()
        notes = [w.upper() for w in topic.split()]
        squares = (n * n for n in range(4))
        next(squares)
        for word in tuple(notes):
            reply = await Ask(word)
            notes.append(reply + str(bump()))
        return notes, list(squares), bump()

    if __name__ == "__main__":
        task = agent("alpha beta")
        print("ASKED", task.send(None).what)
        open(sys.argv[1], "wb").write(tcc.dumps(task))
    '''
)

RESUME = textwrap.dedent(
    '''
    import sys, tcc
    task = tcc.loads(open(sys.argv[1], "rb").read())
    value = "r"
    try:
        for _ in range(100):
            req = task.send(value)
            value = req.what.lower()
    except StopIteration as stop:
        print("RESULT", stop.value)
    '''
)


def test_script_functions_resume_in_a_process_without_the_script(tmp_path):
    """A coroutine defined in a __main__ script resumes in a process that never ran it."""
    script = tmp_path / "agent_script.py"
    script.write_text(SCRIPT)
    blob = tmp_path / "snap.bin"
    first = subprocess.run(
        [sys.executable, str(script), str(blob)], capture_output=True, text=True, timeout=120
    )
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == "ASKED ALPHA"
    script.unlink()  # the resuming process cannot import or read it
    second = subprocess.run(
        [sys.executable, "-c", RESUME, str(blob)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert second.returncode == 0, second.stderr
    expected = (["ALPHA", "BETA", "r1", "beta2"], [1, 4, 9], 3)
    assert second.stdout.strip() == f"RESULT {expected}"
