"""The verdict file: an open skips the structural walk only for a file nothing but trusted commits changed."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tcc.errors import StoreCorruptError
from tcc.store import Completion, open_store
from tcc.store import _verified
from tcc.store._verified import VERIFIED_NAME
from tests._support.stores import payload

pytestmark = pytest.mark.skipif(_verified.boot_id() is None,
                                reason="this system does not tell its boot id: every open walks")


def _fill(path: str, n: int = 4) -> None:
    with open_store(path) as s:
        rid = s.create_run("e", run_id="r").run_id
        for i in range(n):
            seq = s.append_intent(rid, 1, "step")
            s.checkpoint(rid, 1, payload(i, 30_000), completion=Completion(seq, result=b"%d" % i))


def _walked(path: str) -> bool:
    with open_store(path) as s:
        s.get_run("r")
        return bool(s._scope.env.walked)


def _rewrite_same_bytes(path: str) -> None:
    """Write data.mdb's third page back unchanged: a write by something other than tcc."""
    with open(os.path.join(path, "data.mdb"), "r+b") as f:
        f.seek(2 * 4096)
        page = f.read(4096)
        f.seek(2 * 4096)
        f.write(page)


def _break_leaves(path: str) -> None:
    """Give every page that looks like a leaf an odd ``mp_lower``: structural damage."""
    mdb = Path(path) / "data.mdb"
    data = bytearray(mdb.read_bytes())
    for pgno in range(2, len(data) // 4096):
        at = pgno * 4096
        if int.from_bytes(data[at:at + 8], "little") == pgno and data[at + 10] == 0x02:
            data[at + 12] |= 1
    mdb.write_bytes(data)


def test_reopening_an_unchanged_store_skips_the_walk(store_path: str) -> None:
    """A store last changed by tcc's own commits is opened without walking it, with a 0600 verdict."""
    _fill(store_path)
    assert _walked(store_path) is False
    assert os.stat(os.path.join(store_path, VERIFIED_NAME)).st_mode & 0o777 == 0o600


def test_a_write_by_another_program_makes_the_next_open_walk(store_path: str) -> None:
    """Any write to data.mdb outside tcc, even of unchanged bytes, voids the verdict."""
    _fill(store_path)
    _rewrite_same_bytes(store_path)
    assert _walked(store_path) is True
    assert _walked(store_path) is False  # that walk passed and vouched again


def test_damage_after_a_verdict_is_still_refused(store_path: str) -> None:
    """Structural damage written after the last commit is found by the walk the damage forces."""
    _fill(store_path)
    _break_leaves(store_path)
    with pytest.raises(StoreCorruptError, match="data.mdb is damaged"):
        open_store(store_path)


def test_a_commit_does_not_vouch_for_a_change_made_before_it(store_path: str) -> None:
    """A write by another program while the store is open is not blessed by the next commit."""
    _fill(store_path)
    with open_store(store_path) as s:
        _rewrite_same_bytes(store_path)
        seq = s.append_intent("r", 1, "after")
        s.checkpoint("r", 1, payload(99, 30_000), completion=Completion(seq))
    assert _walked(store_path) is True


def test_a_copied_store_or_another_boot_walks(store_path: str, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A verdict names one file on one boot: a copy (another inode) or a reboot walks again."""
    _fill(store_path)
    copy = str(tmp_path / "copy")
    shutil.copytree(store_path, copy)
    assert _walked(copy) is True
    assert _walked(store_path) is False
    monkeypatch.setattr(_verified, "boot_id", lambda: b"\x01" * 16)
    assert _walked(store_path) is True


@pytest.mark.parametrize("damage", ["mac", "truncated", "garbage"])
def test_a_forged_or_torn_verdict_is_ignored(store_path: str, damage: str) -> None:
    """A verdict whose MAC fails (forged, torn or from another store) never skips the walk."""
    _fill(store_path)
    path = os.path.join(store_path, VERIFIED_NAME)
    raw = bytearray(Path(path).read_bytes())
    if damage == "mac":
        raw[0] ^= 1
    elif damage == "truncated":
        del raw[40:]
    else:
        raw = bytearray(os.urandom(len(raw)))
    Path(path).write_bytes(raw)
    assert _walked(store_path) is True


@pytest.mark.parametrize("mode", ["full", "quick", "off"])
def test_store_check_settings(store_path: str, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``full`` walks despite a verdict; ``quick`` and ``off`` vouch for nothing they commit."""
    _fill(store_path)
    monkeypatch.setenv("TCC_STORE_CHECK", mode)
    with open_store(store_path) as s:
        assert s._scope.env.walked is (mode == "full")
        seq = s.append_intent("r", 1, "more")
        s.checkpoint("r", 1, payload(7, 30_000), completion=Completion(seq))
    monkeypatch.setenv("TCC_STORE_CHECK", "auto")
    assert _walked(store_path) is (mode != "full")


def test_a_second_writer_process_keeps_the_verdict_current(store_path: str) -> None:
    """Commits by two processes in turn each vouch for the file the other left."""
    _fill(store_path)
    code = textwrap.dedent("""
        import sys
        from tcc.store import Completion, open_store
        with open_store(sys.argv[1]) as s:
            assert s._scope.env.walked is False
            rid = s.create_run("e").run_id
            seq = s.append_intent(rid, 1, "x")
            s.checkpoint(rid, 1, b"y" * 20000, completion=Completion(seq))
    """)
    with open_store(store_path) as s:
        subprocess.run([sys.executable, "-c", code, store_path], check=True, timeout=60)
        seq = s.append_intent("r", 1, "after the other")
        s.checkpoint("r", 1, payload(8, 30_000), completion=Completion(seq))
    assert _walked(store_path) is False


def test_recovery_after_sigkill_skips_the_walk_and_finds_every_commit(store_path: str) -> None:
    """A writer killed with SIGKILL between commits leaves a verdict its recovery trusts."""
    code = textwrap.dedent("""
        import sys, time
        from tcc.store import Completion, open_store
        s = open_store(sys.argv[1])
        rid = s.create_run("e", run_id="r").run_id
        for i in range(50):
            seq = s.append_intent(rid, 1, "step")
            s.checkpoint(rid, 1, b"%06d" % i * 5000, completion=Completion(seq))
        print("done", flush=True)
        time.sleep(60)
    """)
    with subprocess.Popen([sys.executable, "-c", code, store_path], stdout=subprocess.PIPE,
                          text=True) as proc:
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "done"
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    with open_store(store_path) as s:
        assert s._scope.env.walked is False
        assert s.load_snapshot("r") == b"%06d" % 49 * 5000
        assert len(s.journal("r")) == 100


def test_a_write_during_the_open_is_not_vouched_for(store_path: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A write landing while an open checks the file (after the state it vouches for was
    taken) leaves no verdict for the changed file: the next open walks."""
    from tcc.store import _structure

    _fill(store_path)
    real = _structure.check_data_file

    def check_then_write(*args: object, **kwargs: object) -> object:
        report = real(*args, **kwargs)  # type: ignore[arg-type]
        _rewrite_same_bytes(store_path)
        return report

    monkeypatch.setattr(_structure, "check_data_file", check_then_write)
    for mode in ("auto", "full"):  # the verdict matched / the file was walked
        monkeypatch.setenv("TCC_STORE_CHECK", mode)
        with open_store(store_path) as s:
            s.get_run("r")
    monkeypatch.setattr(_structure, "check_data_file", real)
    monkeypatch.setenv("TCC_STORE_CHECK", "auto")
    assert _walked(store_path) is True


_OTHER_WRITER = textwrap.dedent("""
    import sys
    from tcc.store import Completion, open_store
    with open_store(sys.argv[1]) as s:
        seq = s.append_intent("r", 1, "other")
        s.checkpoint("r", 1, b"z" * 20000, completion=Completion(seq))
""")


def _other_writer(path: str, check: str) -> None:
    subprocess.run([sys.executable, "-c", _OTHER_WRITER, path], check=True, timeout=60,
                   env={**os.environ, "TCC_STORE_CHECK": check})


def test_a_writer_that_did_not_check_the_file_breaks_the_chain(store_path: str) -> None:
    """After a commit by a process that skipped the check (TCC_STORE_CHECK=off), no later
    commit vouches for the file: the next open walks."""
    _fill(store_path)
    with open_store(store_path) as s:
        _other_writer(store_path, "off")
        seq = s.append_intent("r", 1, "after")
        s.checkpoint("r", 1, payload(9, 30_000), completion=Completion(seq))
    assert _walked(store_path) is True


def test_a_commit_by_another_process_right_after_ours_is_not_vouched_for(
        store_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A transaction committed between a commit and its verdict is not blessed by it."""
    from tcc.store._env import EnvHandle

    _fill(store_path)
    real = EnvHandle._vouch

    def late(self: EnvHandle, txnid: int) -> None:
        _other_writer(store_path, "off")
        real(self, txnid)

    with open_store(store_path) as s:
        monkeypatch.setattr(EnvHandle, "_vouch", late)
        seq = s.append_intent("r", 1, "raced")
        s.checkpoint("r", 1, payload(10, 30_000), completion=Completion(seq))
        monkeypatch.setattr(EnvHandle, "_vouch", real)
    assert _walked(store_path) is True


def test_without_a_boot_id_there_is_no_verdict_and_every_open_walks(
        store_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the system does not tell its boot id, nothing is vouched for."""
    monkeypatch.setattr(_verified, "boot_id", lambda: None)
    _fill(store_path)
    assert not os.path.exists(os.path.join(store_path, VERIFIED_NAME))
    assert _walked(store_path) is True and _walked(store_path) is True


def test_an_unwritable_verdict_costs_only_walks(store_path: str) -> None:
    """If the verdict cannot be written, commits still succeed and the next open walks."""
    os.makedirs(store_path, mode=0o700)
    os.mkdir(os.path.join(store_path, VERIFIED_NAME))  # in the way of the file
    _fill(store_path)
    assert _walked(store_path) is True
    with open_store(store_path) as s:
        assert s.load_snapshot("r") == payload(3, 30_000)


def test_compaction_walks_the_new_file_and_vouches_for_it(store_path: str) -> None:
    """`compact` swaps in a new file (another inode): it is walked then, not at the next open."""
    _fill(store_path)
    with open_store(store_path) as s:
        s.compact()
        assert s._scope.env.walked is True
    assert _walked(store_path) is False


def test_opens_and_refused_opens_leave_no_descriptor_behind(store_path: str) -> None:
    """The verdict's descriptors are closed with the store, and when an open is refused."""
    _fill(store_path)
    fds = len(os.listdir("/proc/self/fd"))
    for _ in range(3):
        _walked(store_path)
    _break_leaves(store_path)
    for _ in range(3):
        with pytest.raises(StoreCorruptError):
            open_store(store_path)
    assert len(os.listdir("/proc/self/fd")) == fds
