"""Repeated capture/restore cycles do not leak objects or memory."""

from __future__ import annotations

import gc
import os
import sys

import tcc
from tests._support import programs

CYCLES = int(os.environ.get("TCC_LEAK_CYCLES", "10000"))


def cycle(blob: bytes) -> None:
    task, pending = tcc.loads(blob)
    programs.drive(task, first=pending)
    tcc.dumps((task, pending))


def test_ten_thousand_capture_restore_cycles_keep_object_counts_flat():
    """10k dumps+loads+finish cycles leave the live object and block counts flat."""
    task = programs.closures(3)
    pending = programs.advance(task, 2)
    blob = tcc.dumps((task, pending))
    programs.drive(task, first=pending)
    for _ in range(200):  # warm caches (fingerprints, type decisions, interned names)
        cycle(blob)
    gc.collect()
    objects_before = len(gc.get_objects())
    blocks_before = sys.getallocatedblocks()
    for _ in range(CYCLES):
        cycle(blob)
    gc.collect()
    objects_growth = len(gc.get_objects()) - objects_before
    blocks_growth = sys.getallocatedblocks() - blocks_before
    # A leak of even one object per cycle would show up as >= CYCLES; what is
    # left is allocator and free-list noise that does not grow with CYCLES.
    assert objects_growth < 100, objects_growth
    assert blocks_growth < CYCLES // 10, blocks_growth


def test_failed_restores_do_not_leak():
    """Refused restores (bad code, bad records) leave nothing behind."""
    task = programs.with_cleanup("l")
    task.send(None)
    good = tcc.dumps(task)
    task.close()
    bad = good[:-5] + bytes(5)

    def attempt() -> None:
        try:
            tcc.loads(bad)
        except tcc.RestoreError:
            pass

    for _ in range(100):
        attempt()
    gc.collect()
    before = len(gc.get_objects())
    for _ in range(CYCLES // 5):
        attempt()
    gc.collect()
    assert len(gc.get_objects()) - before < 100
