"""Unpacking the checked-in fixture stores (tests/fixtures) for a test."""

from __future__ import annotations

import hashlib
import os
import tarfile
from pathlib import Path


def unpack_private(archive: Path, archive_sha256: str, dest: Path) -> str:
    """Extract a fixture store's ``tar.gz`` into ``dest``, a new private directory (0700,
    files 0600, ours): the store refuses files another user could have changed.  The
    archive must be the one its manifest describes (``archive_sha256``)."""
    assert hashlib.sha256(archive.read_bytes()).hexdigest() == archive_sha256, (
        f"{archive} is not the archive its manifest describes")
    os.mkdir(dest, 0o700)
    os.chmod(dest, 0o700)
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar.getmembers():
            assert member.isfile() and "/" not in member.name and not member.name.startswith(".")
            src = tar.extractfile(member)
            assert src is not None
            fd = os.open(dest / member.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                         0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(src.read())
    return str(dest)
