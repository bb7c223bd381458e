"""A code object in a snapshot is built only from bytecode CPython can take.

Regression (scripts/asan_fuzz.sh, paper/data/asan-fuzz-20261203-003259.log): payload mutant
#16651 turned a nested function's last instruction into a specialised LOAD_ATTR with no room
for its inline caches; building that code object and reading its ``co_code`` wrote 18 bytes
past a buffer inside CPython 3.12 (``deopt_code``).  ``_records.make_code`` now refuses such
bytecode before any code object is built.
"""

from __future__ import annotations

import dis
import opcode
import pathlib
import sys
import types

import cloudpickle
import pytest

import tcc
from tcc.capture import _records, dump_payload, seal


def outer():
    x = 1

    def inner(y):
        nonlocal x
        x += y
        return x.real

    return inner


def _args(code: types.CodeType) -> tuple:
    return cloudpickle.cloudpickle._code_reduce(code)[1]


def _with_code(code: types.CodeType, co_code: bytes) -> tuple:
    args = list(_args(code))
    assert args[_records._CO_CODE] == code.co_code  # the layout make_code relies on
    args[_records._CO_CODE] = co_code
    return tuple(args)


class _Code:
    """Pickles as make_code(args): a code object in a payload, as tcc's pickler writes one."""

    def __init__(self, args: tuple) -> None:
        self.args = args

    def __reduce__(self):
        return (_records.make_code, (self.args, "forged.py"))


def _specialised() -> list[int]:
    """This interpreter's specialised opcodes (``dis._all_opmap`` has them on 3.11-3.13)."""
    names = getattr(opcode, "_specialized_instructions", None) or list(opcode._specialized_opmap)
    ops = [dis._all_opmap[n] for n in names if n in dis._all_opmap]
    assert ops, names
    return [op for op in ops if op < 256]


def _bad_codes() -> dict[str, bytes]:
    code = outer().__code__
    raw = bytearray(code.co_code)
    out = {}
    last = bytearray(raw)
    last[-2] = _specialised()[0]
    out["a specialised opcode last"] = bytes(last)
    mid = bytearray(raw)
    mid[0] = _specialised()[-1]
    out["a specialised opcode first"] = bytes(mid)
    cached = [op for op in range(256) if op in set(dis.opmap.values())
              and _records._bytecode_tables()[1][op] >= 2]
    short = bytearray(raw)
    short[-2] = cached[0]  # a base opcode whose caches would run past the end
    out["caches past the end"] = bytes(short)
    out["odd length"] = bytes(raw) + b"\x00"
    out["empty"] = b""
    out["a CACHE entry as an instruction"] = b"\x00\x00" + bytes(raw)
    instrumented = [op for name, op in dis.opmap.items() if name.startswith("INSTRUMENTED_")]
    if instrumented:
        bad = bytearray(raw)
        bad[0] = instrumented[0]
        out["an instrumented opcode"] = bytes(bad)
    return out


@pytest.mark.parametrize("what", sorted(_bad_codes()))
def test_make_code_refuses_bytecode_cpython_would_write_past(what: str) -> None:
    code = outer().__code__
    with pytest.raises(tcc.CorruptSnapshotError, match="bytecode"):
        _records.make_code(_with_code(code, _bad_codes()[what]), "x.py")


def test_a_sealed_payload_with_such_bytecode_is_refused_by_loads() -> None:
    """End to end: the seal is valid (the forger had the key), the bytecode is not."""
    code = outer().__code__
    blob = seal(dump_payload(_Code(_with_code(code, _bad_codes()["a specialised opcode last"]))))
    with pytest.raises(tcc.RestoreError, match="bytecode"):
        tcc.loads(blob)
    good = tcc.loads(seal(dump_payload(_Code(_args(code)))))
    assert good.co_code == code.co_code and good.co_filename == "forged.py"


def test_every_compiled_code_object_passes_the_check() -> None:
    """No false refusals: every code object of a few standard-library packages and of tcc."""
    import asyncio
    import email
    import json

    n = 0

    def walk(c: types.CodeType) -> None:
        nonlocal n
        _records.check_bytecode(c.co_code)
        n += 1
        for k in c.co_consts:
            if isinstance(k, types.CodeType):
                walk(k)

    for mod in (asyncio, email, json, tcc):
        for path in pathlib.Path(mod.__file__).parent.rglob("*.py"):
            walk(compile(path.read_text(encoding="utf-8"), str(path), "exec"))
    walk(outer().__code__)
    assert n > 3000, n
    assert sys.version_info >= (3, 11)
