"""Two real users for the store-trust tests: A (root, running tcc) and B (nobody).

Tests that need the second user skip LOUDLY unless they run as root with
``setpriv`` available: they cannot be faked with one user, because what they
check is exactly what the kernel lets another user do.  The fixtures built on
these helpers (``base``, ``users``, ``pub``) live in tests/store/conftest.py.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pathlib
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator

import pytest

B_USER, B_GROUP = "nobody", "nogroup"


def why_not_two_users() -> str | None:
    """Why this machine cannot run a test as two real users (None: it can)."""
    if os.geteuid() != 0:
        return f"this runs as uid {os.geteuid()}, and only root can act as a second user"
    if shutil.which("setpriv") is None:
        return "setpriv (util-linux) is not installed"
    try:
        pwd.getpwnam(B_USER)
        grp.getgrnam(B_GROUP)
    except KeyError as exc:
        return f"there is no user/group {exc}"
    return None


class Users:
    """A is this process's user (root); B is ``nobody``, run through ``setpriv``."""

    def __init__(self, base: pathlib.Path) -> None:
        self.base = base
        self.b_uid = pwd.getpwnam(B_USER).pw_uid
        self.b_gid = grp.getgrnam(B_GROUP).gr_gid

    def as_b(self, script: str, *, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run the shell ``script`` as user B (no supplementary groups)."""
        cmd = ["setpriv", f"--reuid={B_USER}", f"--regid={B_GROUP}", "--clear-groups",
               "sh", "-c", script]
        proc = subprocess.run(cmd, cwd=self.base, capture_output=True, text=True, timeout=60)
        if check and proc.returncode != 0:
            raise AssertionError(f"as {B_USER}: {script!r} -> {proc.returncode}: {proc.stderr}")
        return proc


@contextlib.contextmanager
def scratch_base() -> Iterator[pathlib.Path]:
    """A scratch directory (0755) that user B can reach, removed afterwards."""
    parent = "/tmp" if os.path.isdir("/tmp") else None
    path = pathlib.Path(tempfile.mkdtemp(prefix="tcc-trust-", dir=parent))
    os.chmod(path, 0o755)
    try:
        yield path
    finally:
        with contextlib.suppress(OSError):
            os.chmod(path, 0o755)
        shutil.rmtree(path, ignore_errors=True)


def users_or_skip(base: pathlib.Path) -> Users:
    """Users A and B, or a loud skip where this process cannot be two users."""
    why = why_not_two_users()
    if why is not None:
        pytest.skip(f"needs root to run as two users: {why}")
    return Users(base)


def public_dir(base: pathlib.Path) -> pathlib.Path:
    """A directory every user may write (0777, no sticky bit), inside ``base``."""
    path = base / "pub"
    path.mkdir()
    os.chmod(path, 0o777)
    return path
