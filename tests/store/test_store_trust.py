"""A store another user could write is never used (issue 25, findings 1, 2, 3 and 8c).

Snapshots are pickles, and unpickling runs code: whoever can write a store's
files can run code as whoever resumes from it.  These tests perform each attack
for real -- user B is ``nobody``, run through ``setpriv``, with only the access
the kernel gives it -- and check that tcc (user A, root here) refuses the store
with one clear error line instead of using it.
"""

from __future__ import annotations

import os
import pathlib
import resource
import stat
import subprocess
import sys
import warnings

import pytest

from tcc import errors
from tcc.store import open_store

from tests._support.users import Users  # user A (this process) and user B (nobody, via setpriv)

AGENT = '''\
import tcc


async def main():
    ok = await tcc.approval("go?")
    return ["benign", ok]
'''

# A run whose snapshot holds an object that runs a shell command when it is
# unpickled -- what any snapshot written by another user can do.  It fires only
# once the test has created `armed` (so that creating and approving the run,
# done by the test itself, cannot set it off) and records who ran it.
EVIL_AGENT = '''\
import os

import tcc

HERE = os.path.dirname(os.path.abspath(__file__))
ARMED, PWNED = os.path.join(HERE, "armed"), os.path.join(HERE, "pwned")


class Payload:
    """Unpickling one runs a shell command as whoever loads the snapshot."""

    def __reduce__(self):
        return (os.system, (f"test -e '{ARMED}' && id -un >> '{PWNED}'",))


async def main():
    payload = Payload()
    ok = await tcc.approval("go?")
    return ["evil", ok, str(payload)]
'''


def tcc(store: os.PathLike[str] | str, *args: str, cwd: os.PathLike[str] | str | None = None,
        timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``tcc COMMAND --store STORE ARGS...`` as this process's user (A)."""
    cmd = [sys.executable, "-m", "tcc", args[0], "--store", os.fspath(store), *args[1:]]
    return subprocess.run(cmd, cwd=cwd, env=dict(os.environ, **env), capture_output=True, text=True,
                          timeout=timeout)


def error_line(proc: subprocess.CompletedProcess[str], *needles: str) -> str:
    """Assert ``proc`` failed with exactly one clear ``tcc: error:`` line; return it."""
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("tcc: ") or "Error" in ln]
    bad = [ln for ln in lines if not ln.startswith("tcc: warning:")]
    assert proc.returncode == 1 and len(bad) == 1 and bad[0].startswith("tcc: error:"), (
        proc.returncode, proc.stdout, proc.stderr)
    assert "internal error" not in bad[0] and "Traceback" not in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in bad[0], (needle, bad[0])
    return bad[0]


def parked(where: pathlib.Path, store: pathlib.Path, agent: str = AGENT) -> None:
    """Create run "r" in ``store`` from ``agent`` (written to ``where``), parked and approved."""
    script = where / ("evil_agent.py" if agent is EVIL_AGENT else "agent.py")
    script.write_text(agent)
    os.chmod(script, 0o644)
    for args in (("run", "--run-id", "r", str(script)), ("approve", "r")):
        proc = tcc(store, *args)
        assert proc.returncode == 0, (args, proc.stdout, proc.stderr)


DONE_AGENT = "async def main():\n    return 'done'\n"


def insecure(exc: BaseException) -> None:
    """The refusal is a StoreInsecureError (a StoreError and a PermissionError)."""
    assert type(exc).__name__ == "StoreInsecureError" and isinstance(exc, PermissionError), exc


def mode_of(path: os.PathLike[str] | str) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def agent(where: pathlib.Path, text: str = DONE_AGENT) -> pathlib.Path:
    script = where / "done_agent.py"
    script.write_text(text)
    os.chmod(script, 0o644)
    return script


# ------------------------------------------------------------------ finding 1: another user's store


def test_a_store_swapped_in_by_another_user_is_refused_and_never_unpickled(
        users: Users, base: pathlib.Path, pub: pathlib.Path) -> None:
    """B swaps A's store for B's own, whose snapshot runs a command when unpickled: A's resume refuses it and nothing runs."""
    store = pub / "store"
    parked(base, store)  # A's own run r, parked and approved
    # B's store: built here, because B cannot run this interpreter (it lives under /root),
    # and copied by B, so that every file of it is B's, as if B had made it
    template = base / "template"
    template.mkdir()
    parked(base, template / "store", EVIL_AGENT)
    subprocess.run(["chmod", "-R", "a+rX", str(template)], check=True)
    (base / "armed").touch()
    users.as_b("cp -r template/store pub/bstore && chmod 700 pub/bstore && chmod 600 pub/bstore/* "
               "&& mv pub/store pub/old && mv pub/bstore pub/store")
    assert os.stat(store).st_uid == users.b_uid

    proc = tcc(store, "resume", "r")
    pwned = base / "pwned"
    assert not pwned.exists(), f"B's snapshot ran code as {pwned.read_text().strip()}: {proc.stderr}"
    line = error_line(proc, str(store), "owned by", "chown")
    assert "nobody" in line, line

    # the control: once A takes the store over as its own, B's snapshot does run code
    subprocess.run(["chown", "-R", "0:0", str(store)], check=True)
    proc = tcc(store, "resume", "r")
    assert proc.returncode == 0, proc.stderr
    assert pwned.read_text().split() == ["root"]


@pytest.mark.parametrize("target,mode,group", [
    ("", 0o777, False), ("", 0o770, True), ("secret", 0o666, False), ("data.mdb", 0o660, True),
    ("lock.mdb", 0o666, False), ("verified", 0o646, False), ("tcc.lock", 0o666, False),
], ids=["dir-0777", "dir-0770-group", "secret-0666", "data-0660-group", "lock-0666",
        "verified-0646", "tcc.lock-0666"])
def test_a_store_another_user_can_write_is_refused(
        users: Users, base: pathlib.Path, target: str, mode: int, group: bool) -> None:
    """A store whose directory or a file of it B can write (as B checks) is refused, naming it and the chmod that fixes it."""
    store = base / "store"
    parked(base, store)
    path = store / target if target else store
    if target:
        os.chmod(store, 0o711)  # B may reach the file by name, not change the directory
    if group:
        os.chown(path, -1, users.b_gid)
    os.chmod(path, mode)
    users.as_b(f"test -w '{path}'")  # B really can write it
    for args in (("ls",), ("show", "r"), ("resume", "r")):
        proc = tcc(store, *args)
        error_line(proc, str(path), "writable by", "chmod 700")
    os.chmod(path, 0o700 if not target else 0o600)  # the fix the message names
    os.chmod(store, 0o700)
    proc = tcc(store, "ls")
    assert proc.returncode == 0, proc.stderr


def test_a_group_writable_store_opens_only_with_the_shared_group_opt_in(
        users: Users, base: pathlib.Path) -> None:
    """A store B owns and B's group may write opens for a member of that group only with TCC_STORE_SHARED_GROUP naming it; other-writable never."""
    store = base / "store"
    parked(base, store)
    subprocess.run(["chown", "-R", f"{users.b_uid}:{users.b_gid}", str(store)], check=True)
    subprocess.run(["chmod", "-R", "u=rwX,g=rwX,o=", str(store)], check=True)
    users.as_b(f"test -w '{store}' && test -w '{store}/data.mdb'")
    member = ["setpriv", "--groups", str(users.b_gid), sys.executable, "-m", "tcc", "ls", "--store",
              str(store)]

    def ls(*, opt_in: str | None, in_group: bool) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k != "TCC_STORE_SHARED_GROUP"}
        if opt_in is not None:
            env["TCC_STORE_SHARED_GROUP"] = opt_in
        cmd = member if in_group else member[3:]
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)

    error_line(ls(opt_in=None, in_group=True), "owned by nobody", "TCC_STORE_SHARED_GROUP=nogroup")
    error_line(ls(opt_in="nogroup", in_group=False), "not a member")
    error_line(ls(opt_in="root", in_group=True), "nor by a member of group root")  # not that group
    proc = ls(opt_in="nogroup", in_group=True)
    assert proc.returncode == 0 and "r" in proc.stdout, proc.stderr
    os.chmod(store / "lock.mdb", 0o662)
    error_line(ls(opt_in="nogroup", in_group=True), "lock.mdb", "writable by")


# ------------------------------------------------------------------ finding 1: directories tcc creates


def test_parent_directories_tcc_creates_are_private_under_umask_000(base: pathlib.Path) -> None:
    """Under umask 000, `--store s000/sub/store` creates s000 and s000/sub 0700 (not 0777), and the store private."""
    script = agent(base)
    proc = subprocess.run(["sh", "-c", 'umask 000 && exec "$0" -m tcc run --store s000/sub/store "$1"',
                           sys.executable, str(script)], cwd=base, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    for d in ("s000", "s000/sub", "s000/sub/store"):
        assert mode_of(base / d) == 0o700, (d, oct(mode_of(base / d)))
    for f in (base / "s000/sub/store").iterdir():
        assert mode_of(f) & 0o077 == 0, (f, oct(mode_of(f)))


def test_another_user_cannot_replace_a_store_under_a_directory_tcc_created(
        users: Users, base: pathlib.Path) -> None:
    """B cannot rename or add anything in the parent directory tcc created under umask 000 (s000 was 0777)."""
    script = agent(base)
    proc = subprocess.run(["sh", "-c", 'umask 000 && exec "$0" -m tcc run --store s000/store "$1"',
                           sys.executable, str(script)], cwd=base, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    moved = users.as_b("mv s000/store s000/old", check=False)
    assert moved.returncode != 0, "B renamed A's store away"
    added = users.as_b("mkdir s000/bstore", check=False)
    assert added.returncode != 0, "B created a directory next to A's store"
    assert tcc(base / "s000/store", "ls").returncode == 0


# ------------------------------------------------------------------ finding 2: a planted lock.mdb


def test_a_lock_file_planted_by_another_user_is_refused(
        users: Users, base: pathlib.Path, pub: pathlib.Path) -> None:
    """B hard-links a 0666 file of B's into A's empty 0777 directory as lock.mdb: A's tcc refuses it, before and after A chmods the directory, and never writes it."""
    fresh = pub / "fresh"
    fresh.mkdir()
    os.chmod(fresh, 0o777)
    users.as_b("umask 000 && : > pub/bfile && ln pub/bfile pub/fresh/lock.mdb")
    bfile = pub / "bfile"
    script = agent(base)
    error_line(tcc(fresh, "run", str(script)), str(fresh), "writable by", "chmod 700")
    assert bfile.stat().st_size == 0, "A's tcc wrote B's lock file"
    os.chmod(fresh, 0o700)  # the fix for the directory's mode alone
    error_line(tcc(fresh, "run", str(script)), "lock.mdb", "owned by")
    assert bfile.stat().st_size == 0, "A's tcc wrote B's lock file"


@pytest.mark.parametrize("name", ["data.mdb", "lock.mdb", "secret", "verified", "initialised"])
def test_a_store_file_with_a_second_hard_link_is_refused(tmp_path: pathlib.Path, name: str) -> None:
    """A store file that has another name elsewhere (st_nlink 2), through which it can change behind tcc's back, is refused."""
    store = tmp_path / "store"
    with open_store(store) as s:
        s.create_run("e", run_id="r")
    os.link(store / name, tmp_path / "other")
    with pytest.raises(errors.StoreError, match=f"{name} has 2 hard links") as refused:
        open_store(store, create=False)
    insecure(refused.value)
    os.unlink(tmp_path / "other")
    with open_store(store, create=False) as s:
        assert s.get_run("r").entry == "e"


# ------------------------------------------------------------------ finding 3: secret temp files


def test_a_secret_temp_file_planted_by_another_user_does_not_leak_the_secret(
        users: Users, base: pathlib.Path, pub: pathlib.Path) -> None:
    """B links secret.<pid>.tmp, for the pid of A's next tcc, to a 0666 file of B's in A's empty 0777 directory: nothing is written to B's file."""
    fresh = pub / "fresh"
    fresh.mkdir()
    os.chmod(fresh, 0o777)
    users.as_b("umask 000 && : > pub/bfile")
    script = agent(base)
    proc = subprocess.Popen(  # started first, so that B knows its pid; `exec` keeps it
        ["sh", "-c", 'read go && exec "$0" -m tcc run --store "$1" "$2"', sys.executable,
         str(fresh), str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        users.as_b(f"ln pub/bfile pub/fresh/secret.{proc.pid}.tmp")
        out, err = proc.communicate("go\n", timeout=120)
    finally:
        proc.kill()
        proc.wait()
    leaked = users.as_b("wc -c < pub/bfile").stdout.strip()
    assert leaked == "0", f"B's file holds {leaked} bytes of A's secret; tcc said: {err}"
    error_line(subprocess.CompletedProcess(proc.args, proc.returncode, out, err), "writable by")


def test_a_secret_temp_file_planted_before_the_directory_was_made_private_is_never_used(
        users: Users, pub: pathlib.Path) -> None:
    """B's secret.<pid>.tmp for this very process, planted while the directory was 0777, is refused after A makes it 0700, and never written."""
    fresh = pub / "fresh"
    fresh.mkdir()
    os.chmod(fresh, 0o777)
    users.as_b(f"umask 000 && : > pub/bfile && ln pub/bfile pub/fresh/secret.{os.getpid()}.tmp")
    os.chmod(fresh, 0o700)
    refused: BaseException | None = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an unfixed tcc only warns: see what it did instead
        try:
            open_store(fresh).close()
        except errors.StoreError as exc:
            refused = exc
    assert (pub / "bfile").stat().st_size == 0, "the secret was written into B's file"
    assert refused is not None and f"secret.{os.getpid()}.tmp is owned by" in str(refused), refused
    insecure(refused)
    assert not (fresh / "secret").exists()


def test_a_secret_temp_file_is_created_exclusively_and_removed(tmp_path: pathlib.Path) -> None:
    """A new store's secret is 0600 with one link, and no temp file is left beside it."""
    store = tmp_path / "store"
    with open_store(store):
        pass
    st = os.lstat(store / "secret")
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600 and st.st_nlink == 1
    assert st.st_size == 32
    assert not [n for n in os.listdir(store) if n.endswith(".tmp")]


# ------------------------------------------------------------------ finding 8c: odd secret files


def test_a_fifo_in_place_of_the_secret_is_an_error_not_a_hang(base: pathlib.Path) -> None:
    """A FIFO named `secret` makes `tcc ls` fail at once with one clear line instead of hanging."""
    store = base / "store"
    parked(base, store)
    os.unlink(store / "secret")
    os.mkfifo(store / "secret", 0o600)
    try:
        proc = tcc(store, "ls", timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("`tcc ls` hung on a FIFO in place of the store secret")
    error_line(proc, f"{store}/secret", "not a regular file")


def test_a_secret_symlinked_to_dev_zero_is_an_error_not_a_memory_error(base: pathlib.Path) -> None:
    """A `secret` that is a symbolic link to /dev/zero gives one clear error line, not an internal MemoryError."""
    store = base / "store"
    parked(base, store)
    os.unlink(store / "secret")
    os.symlink("/dev/zero", store / "secret")

    def limit() -> None:  # so that the unfixed read of /dev/zero fails fast, not by filling RAM
        resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))

    proc = subprocess.run([sys.executable, "-m", "tcc", "ls", "--store", str(store)],
                          capture_output=True, text=True, timeout=120, preexec_fn=limit)
    assert "MemoryError" not in proc.stderr, proc.stderr
    error_line(proc, f"{store}/secret", "symbolic link")


def test_a_secret_symlinked_to_another_file_is_never_followed(tmp_path: pathlib.Path) -> None:
    """A store whose `secret` is a symbolic link (to a file of the right size) is refused, not read through the link."""
    store = tmp_path / "store"
    with open_store(store) as s:
        s.create_run("e", run_id="r")
    os.rename(store / "secret", tmp_path / "real-secret")
    os.symlink(tmp_path / "real-secret", store / "secret")
    with pytest.raises(errors.StoreError, match="symbolic link") as refused:
        open_store(store, create=False)
    insecure(refused.value)

