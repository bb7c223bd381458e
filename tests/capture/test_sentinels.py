"""Stateless objects a module binds at module level (sentinels) are named, not copied, so
``is`` tests answer the same after a load; anything else of their types is copied as before."""

from __future__ import annotations

import dataclasses
import importlib
import sys
import uuid
from pathlib import Path

import pytest

import tcc
from tcc import errors
from tcc.capture import _blob, _records, _singletons, safe_loads


@pytest.fixture
def library(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A fresh importable module: MISSING = object(), a stateless class instance, one with
    state, and an instance of the stateless class bound nowhere."""
    name = f"sentinel_lib_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(
        "class Marker:\n    pass\n\n"
        "MISSING = object()\nDEFAULT = object()\nEMPTY = Marker()\nFULL = Marker()\nFULL.value = 1\n"
        "import threading\nLOCK = threading.Lock()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module(name)
    yield module
    sys.modules.pop(name, None)


def test_a_module_level_sentinel_loads_as_the_same_object(library) -> None:
    out = tcc.loads(tcc.dumps([library.MISSING, library.EMPTY, dataclasses.MISSING]))
    assert out[0] is library.MISSING and out[1] is library.EMPTY
    assert out[2] is dataclasses.MISSING


def test_objects_with_state_or_bound_nowhere_are_copies(library) -> None:
    loose = library.Marker()
    full, again, plain = tcc.loads(tcc.dumps([library.FULL, loose, object()]))
    assert full is not library.FULL and full.value == 1
    assert again is not loose and type(again) is library.Marker
    assert type(plain) is object


def test_a_module_level_object_of_a_c_type_is_still_refused_not_named(library) -> None:
    """A lock shows no state to ``__getstate__`` but has some: it is refused as before, never
    replaced by the import's (unlocked) lock."""
    with pytest.raises(errors.CaptureError, match="lock"):
        tcc.dumps({"held": library.LOCK})


def test_a_sentinel_rebound_since_it_was_found_is_copied(library) -> None:
    old = library.MISSING
    assert _singletons.home(old) is not None
    library.MISSING = object()
    assert _singletons.home(old) is None
    assert tcc.loads(tcc.dumps(old)) is not old


def test_a_sentinel_the_module_no_longer_binds_loads_as_a_copy(library) -> None:
    """Gone from its module (the code changed), or bound to an object of another class: a
    new object of the captured class stands in, as the copy pickling by value made."""
    blob = tcc.dumps([library.MISSING, library.EMPTY])
    del library.MISSING
    library.EMPTY = object()
    missing, empty = tcc.loads(blob)
    assert type(missing) is object and type(empty) is library.Marker
    with pytest.raises(errors.CorruptSnapshotError):
        _records.module_attribute(1, "x")


def test_a_stateless_object_the_agent_bound_during_the_run_keeps_its_class(library) -> None:
    """A state machine that moved `cursor` from Start() to End() (classes with no state):
    the module binds Start() after an import, and the restore must give an End (review
    finding: it gave the import's Start)."""
    library.cursor = library.Marker()  # what the import bound
    blob_before = tcc.dumps(library.cursor)

    class End:
        pass

    End.__module__, End.__qualname__ = library.__name__, "End"
    library.End = End
    library.cursor = End()  # moved on during the run
    blob = tcc.dumps({"cursor": library.cursor})
    library.cursor = library.Marker()  # a fresh import binds the start state again
    assert type(tcc.loads(blob)["cursor"]) is End
    assert type(tcc.loads(blob_before)) is library.Marker


def test_the_restricted_loader_names_a_sentinel_without_importing(library) -> None:
    shown = safe_loads(_blob.unseal(tcc.dumps({"m": library.MISSING})))
    assert library.__name__ in repr(shown["m"]) and "MISSING" in repr(shown["m"])


def test_openai_not_given_keeps_its_identity() -> None:
    openai = pytest.importorskip("openai")
    assert tcc.loads(tcc.dumps({"temperature": openai.NOT_GIVEN}))["temperature"] is openai.NOT_GIVEN


class Tool:
    """Hashed by its name, and a key of a dict that it refers back to: pickling rebuilds the
    dict's keys before their attributes are set."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.registry: dict[Tool, int] = {}

    def __hash__(self) -> int:
        return hash(self.name)


def test_a_snapshot_a_class_cannot_rebuild_says_why_and_what_to_do() -> None:
    tool = Tool("search")
    tool.registry[tool] = 1
    blob = tcc.dumps(tool)
    with pytest.raises(errors.CorruptSnapshotError, match="could not be rebuilt: AttributeError") as info:
        tcc.loads(blob)
    assert "reference cycle" in str(info.value) and "__hash__" in str(info.value)


def test_a_class_that_is_gone_is_named(tmp_path, monkeypatch) -> None:
    name = f"gone_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text("class Thing:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module(name)
    blob = tcc.dumps(module.Thing())
    del module.Thing
    with pytest.raises(errors.IncompatibleSnapshotError, match=rf"refers to {name}\.Thing, which cannot be found"):
        tcc.loads(blob)
    sys.modules.pop(name, None)


def test_a_call_journaled_with_a_copied_sentinel_is_the_same_call_as_one_naming_it(library) -> None:
    """A journal written before sentinels were named holds a copy of `MISSING`; the code now
    journals the name.  Replay must take them for the same arguments (a completed call
    would otherwise be refused as a divergence after the upgrade)."""
    from tcc.capture import dump_payload
    from tcc.runtime._journal import _same_arguments

    copied = dump_payload(((object(), library.Marker()), {}))  # bound nowhere: by value
    named = dump_payload(((library.MISSING, library.EMPTY), {}))
    assert copied != named and _same_arguments(copied, named)
    # two sentinels the module names are two different calls
    assert not _same_arguments(dump_payload(((library.MISSING,), {})), dump_payload(((library.DEFAULT,), {})))
    assert not _same_arguments(dump_payload(((library.FULL,), {})), dump_payload(((library.EMPTY,), {})))


def test_a_module_whose_import_raises_is_named_in_the_load_error(tmp_path, monkeypatch) -> None:
    name = f"breaks_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text("class Thing:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    blob = tcc.dumps(importlib.import_module(name).Thing())
    sys.modules.pop(name, None)
    (tmp_path / f"{name}.py").write_text("raise RuntimeError('no config')\n")
    importlib.invalidate_caches()
    with pytest.raises(errors.IncompatibleSnapshotError,
                       match=rf"importing module {name} raised RuntimeError: no config"):
        tcc.loads(blob)
    sys.modules.pop(name, None)
