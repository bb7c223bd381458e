"""Snapshot blobs written by earlier tcc builds still load and resume.

``tests/fixtures/snapshots/<interpreter>/`` holds, per interpreter, sealed
blobs (``tcc.dumps``) of the small programs in
``tests/fixtures/snapshot_programs.py`` suspended part-way, each with a
manifest saying what resuming it must produce (made by
``scripts/make_fixtures.py``; see ``tests/fixtures/README.md``).  A change to the
envelope, the frame records or the reconstructors that would strand users'
snapshots fails here.  Blobs of another interpreter must be refused as
incompatible (never resumed, never reported as damage).
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tcc import errors
from tcc.capture import interpreter_tag, loads, unseal

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
SNAPSHOTS = FIXTURES / "snapshots"
TAG = sys.implementation.cache_tag  # the fixture directory of this interpreter, e.g. cpython-312

if str(FIXTURES) not in sys.path:  # the blobs name their functions by this module name
    sys.path.insert(0, str(FIXTURES))
import snapshot_programs as programs  # noqa: E402


def _manifests(where: Path) -> list[tuple[str, dict[str, Any]]]:
    return [(f"{p.parent.name}/{p.stem}", json.loads(p.read_text()))
            for p in sorted(where.glob("*/*.json"))]


ALL = _manifests(SNAPSHOTS)
OURS = [(name, m) for name, m in ALL if name.split("/")[0] == TAG]
OTHERS = [(name, m) for name, m in ALL if name.split("/")[0] != TAG]


def _blob(name: str, manifest: dict[str, Any]) -> bytes:
    blob = (SNAPSHOTS / name.split("/")[0] / manifest["blob"]).read_bytes()
    assert hashlib.sha256(blob).hexdigest() == manifest["blob_sha256"], (
        f"{name}: the blob is not the one its manifest describes")
    return blob


def test_fixtures_cover_the_supported_interpreters() -> None:
    tags = {name.split("/")[0] for name, _ in ALL}
    assert {"cpython-311", "cpython-312", "cpython-313"} <= tags
    programs_per_tag = {t: sorted(n.split("/")[1] for n, _ in ALL if n.startswith(t + "/")) for t in tags}
    assert len({tuple(p) for p in programs_per_tag.values()}) == 1, programs_per_tag


@pytest.mark.skipif(not OURS, reason=f"no snapshot fixtures for {TAG} (scripts/make_fixtures.py)")
@pytest.mark.parametrize("name, manifest", OURS, ids=[n for n, _ in OURS])
def test_old_snapshot_resumes(name: str, manifest: dict[str, Any]) -> None:
    assert manifest["interpreter"] == interpreter_tag().decode(), (
        f"{name} was written on {manifest['interpreter']}; this interpreter's tag changed")
    state = loads(_blob(name, manifest))
    task = state["task"]
    assert type(task).__qualname__ in ("coroutine", "generator")
    trace, result = programs.drive(task, state["resume_with"])
    assert trace == manifest["expected_trace"]
    assert result == manifest["expected_result"]


@pytest.mark.skipif(not OURS, reason=f"no snapshot fixtures for {TAG} (scripts/make_fixtures.py)")
@pytest.mark.parametrize("name, manifest", OURS, ids=[n for n, _ in OURS])
def test_old_snapshot_loads_twice_independently(name: str, manifest: dict[str, Any]) -> None:
    """Every load gives new objects: resuming one copy leaves the other where it was."""
    blob = _blob(name, manifest)
    first, second = loads(blob), loads(blob)
    want = (manifest["expected_trace"], manifest["expected_result"])
    assert programs.drive(first["task"], first["resume_with"]) == want
    assert programs.drive(second["task"], second["resume_with"]) == want


@pytest.mark.parametrize("name, manifest", OTHERS, ids=[n for n, _ in OTHERS])
def test_other_interpreters_snapshot_is_refused(name: str, manifest: dict[str, Any]) -> None:
    blob = _blob(name, manifest)
    for read in (loads, unseal):
        with pytest.raises(errors.IncompatibleSnapshotError) as info:
            read(blob)
        assert manifest["interpreter"] in str(info.value)
