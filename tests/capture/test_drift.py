"""Snapshots never resume the wrong code: drift is refused before any frame is written."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import textwrap

import pytest

import tcc
from tcc.capture import _blob
from tests._support import programs

AGENT_V1 = '''
import tcc_test_req as req

LOG = []

async def main(topic):
    try:
        first = await req.ask("plan", topic)
        second = await req.ask("write", first)
        return first + "|" + second
    finally:
        LOG.append("finally ran")
'''

REQ_MODULE = '''
class Ask:
    def __init__(self, kind, arg):
        self.kind, self.arg = kind, arg
    def __await__(self):
        return (yield self)

async def ask(kind, arg):
    return await Ask(kind, arg)
'''

DUMP = '''
import sys, agent, tcc
task = agent.main("t")
task.send(None)
open(sys.argv[1], "wb").write(tcc.dumps(task))
'''

LOAD = '''
import sys, agent, tcc
try:
    task = tcc.loads(open(sys.argv[1], "rb").read())
except tcc.RestoreError as exc:
    print("REFUSED", type(exc).__name__, exc)
    print("LOG", agent.LOG)
    sys.exit(0)
req = task.send("P")
try:
    task.send("W")
except StopIteration as stop:
    print("RESULT", stop.value)
print("LOG", agent.LOG)
'''


def run(tmp_path, code, *args):
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.fixture
def project(tmp_path):
    (tmp_path / "tcc_test_req.py").write_text(REQ_MODULE)
    (tmp_path / "agent.py").write_text(AGENT_V1)
    blob = tmp_path / "snap.bin"
    run(tmp_path, DUMP, str(blob))
    return tmp_path, blob


def rewrite(path, source):
    path.write_text(source)
    for cached in (path.parent / "__pycache__").glob(path.stem + ".*"):
        cached.unlink()


def test_unchanged_code_resumes(project):
    """The same module source restores and finishes in a fresh process."""
    tmp_path, blob = project
    out = run(tmp_path, LOAD, str(blob))
    assert "RESULT P|W" in out
    assert "LOG ['finally ran']" in out


def test_comment_and_line_changes_still_resume(project):
    """Moving code down by adding comments does not change offsets, so it resumes."""
    tmp_path, blob = project
    rewrite(tmp_path / "agent.py", "# a new header comment\n# and another\n" + AGENT_V1)
    assert "RESULT P|W" in run(tmp_path, LOAD, str(blob))


@pytest.mark.parametrize(
    "old, new",
    [
        ('return first + "|" + second', 'return first + "/" + second'),
        ("second = await req.ask(\"write\", first)", "second = await req.ask(\"edit\", first)"),
        ("LOG.append(\"finally ran\")", "LOG.append(\"cleanup\"); LOG.append(1)"),
    ],
    ids=["constant", "argument", "finally-body"],
)
def test_changed_code_is_refused_before_any_frame_runs(project, old, new):
    """An edited function refuses to restore, names itself, and runs none of its code."""
    tmp_path, blob = project
    rewrite(tmp_path / "agent.py", AGENT_V1.replace(old, new))
    out = run(tmp_path, LOAD, str(blob))
    assert "REFUSED CodeChangedError the code of main()" in out
    assert "agent.py" in out
    assert "LOG []" in out


def test_changed_callee_is_refused(project):
    """A change in a function deeper in the await chain is caught as well."""
    tmp_path, blob = project
    rewrite(tmp_path / "tcc_test_req.py", REQ_MODULE.replace("return await Ask", "x = 1\n    return await Ask"))
    assert "REFUSED CodeChangedError the code of ask()" in run(tmp_path, LOAD, str(blob))


def test_removed_function_is_refused(project):
    """A function that no longer exists gives an IncompatibleSnapshotError naming it."""
    tmp_path, blob = project
    rewrite(tmp_path / "agent.py", AGENT_V1.replace("async def main", "async def renamed"))
    out = run(tmp_path, LOAD, str(blob))
    assert "REFUSED IncompatibleSnapshotError" in out and "main" in out


def retag(blob: bytes, tag: bytes) -> bytes:
    magic, version, taglen = _blob._FIXED.unpack_from(blob)
    rest = blob[_blob._FIXED.size + taglen :]
    return _blob._FIXED.pack(magic, version, len(tag)) + tag + rest


def suspended_blob() -> bytes:
    task = programs.with_cleanup("d")
    task.send(None)
    try:
        return tcc.dumps(task)
    finally:
        task.close()


@pytest.mark.parametrize(
    "tag",
    [b"cpython-399|00000000|O0", _blob.interpreter_tag().replace(b"|O0", b"|O1")],
    ids=["other-interpreter", "optimize-flag"],
)
def test_other_interpreter_or_optimize_level_is_refused(tag):
    """A blob from another interpreter version or -O level is refused with both tags named."""
    if tag == _blob.interpreter_tag():
        pytest.skip("running under -O1 already")
    with pytest.raises(tcc.IncompatibleSnapshotError, match="snapshot was taken on interpreter"):
        tcc.loads(retag(suspended_blob(), tag))


def test_other_format_version_is_refused():
    """A blob of another format version is refused as incompatible."""
    blob = bytearray(suspended_blob())
    struct.pack_into(">H", blob, 4, _blob.FORMAT_VERSION + 1)
    with pytest.raises(tcc.IncompatibleSnapshotError, match="format version"):
        tcc.loads(bytes(blob))


def test_real_other_interpreter_is_refused(tmp_path):
    """A snapshot made by another installed CPython minor version is refused by this one."""
    other = os.environ.get("TCC_OTHER_PYTHON")
    if not other:
        pytest.skip("set TCC_OTHER_PYTHON to an interpreter with tcc installed")
    code = textwrap.dedent(
        """
        import sys, tcc
        def gen():
            yield 1
            yield 2
        g = gen(); next(g)
        open(sys.argv[1], "wb").write(tcc.dumps(g))
        """
    )
    target = tmp_path / "other.bin"
    subprocess.run([other, "-c", code, str(target)], check=True, timeout=120)
    with pytest.raises(tcc.IncompatibleSnapshotError):
        tcc.loads(target.read_bytes())


@pytest.mark.parametrize("cut", [0, 3, 10, 40, -1])
def test_truncated_blob_is_corrupt(cut):
    """Any truncation is refused as corrupt or incompatible, never unpickled."""
    blob = suspended_blob()
    with pytest.raises(tcc.RestoreError):
        tcc.loads(blob[:cut])


def test_every_single_bit_flip_in_the_payload_is_detected():
    """Flipping any one bit of the payload is caught by the integrity digest."""
    blob = suspended_blob()
    header = _blob._FIXED.size + len(_blob.interpreter_tag()) + 1
    for pos in range(header, len(blob)):
        for bit in (0, 7):
            mutant = bytearray(blob)
            mutant[pos] ^= 1 << bit
            with pytest.raises((tcc.CorruptSnapshotError, tcc.IncompatibleSnapshotError)):
                tcc.loads(bytes(mutant))
