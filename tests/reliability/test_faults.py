"""Resource faults: full disk, failing writes and fsync, map growth under readers, stale readers.

Issue 7, item 4.  For every fault: a clear one-line tcc error (exit 1, no
traceback) naming the store, nothing committed before is lost, and once the
fault clears `tcc resume` finishes the run with the exact result (a step runs
twice only if it was in flight when a commit failed).

* disk full: the store on a 3 MiB tmpfs (needs root for `mount`; skipped
  otherwise), then remounted at 64 MiB;
* a write failing like a full disk: RLIMIT_FSIZE makes LMDB's writes fail
  with EFBIG;
* EIO from fsync: LMDB calls ``fdatasync`` through libc, so an LD_PRELOAD shim
  (compiled here with gcc; skipped without it) fails it with EIO while a
  trigger file exists;
* map growth: a writer starting from a 1 MiB map grows it while a long-lived
  reader (1 MiB map too) and `tcc ls`/`tcc show` processes keep reading;
* a stale reader: a process SIGKILLed while holding a read transaction pins
  old pages; the next open (`tcc gc`, `tcc ls`) calls reader_check, after
  which the long-lived writer's file stops growing.

Sizes: ``TCC_FAULT_STALE_COMMITS`` [150] commits after the reader check; the slow
tier's fsync-EIO campaign injects ``TCC_SLOW_FAULT_CYCLES`` [30] faults into one run.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests._support.runs import Cli
from tests._support.reliability import wait_until

FIG: collections.Counter[str] = collections.Counter()
BLOB = 49152
STEPS = 40

GROW_AGENT = '''
"""State grows by BLOB incompressible bytes per step (in the journal and in the snapshot)."""
import hashlib
import os
import time

import tcc

LEDGER = os.environ["LEDGER"]
BLOB = int(os.environ.get("BLOB", "49152"))
DELAY = float(os.environ.get("DELAY", "0"))


def block(step):
    out = bytearray()
    i = 0
    while len(out) < BLOB:
        out += hashlib.blake2b(f"{step}:{i}".encode(), digest_size=64).digest()
        i += 1
    return bytes(out[:BLOB])


@tcc.effect
def fetch(step):
    time.sleep(DELAY)
    with open(LEDGER, "a") as fh:
        fh.write(f"{tcc.current().idempotency_key} {step}\\n")
    return block(step)


async def main(steps="40"):
    blobs = []
    for step in range(int(steps)):
        blobs.append(await fetch(step))
    return {"steps": len(blobs), "bytes": sum(map(len, blobs)),
            "sha": hashlib.sha256(b"".join(blobs)).hexdigest()}
'''


@pytest.fixture(scope="module", autouse=True)
def _summary():
    """Print the module's figures once all its tests ran (visible with -s)."""
    yield
    print(
        f"\nfaults: tmpfs_full_at_step={FIG['tmpfs_full_at']} fsize_full_at_step={FIG['fsize_full_at']} "
        f"fsync_eio_at_step={FIG['eio_at']} fault_errors={FIG['fault_errors']} "
        f"reissued_after_fault={FIG['reissued']} resumed_exact={FIG['resumed_exact']} "
        f"map_grew_to={FIG['map_bytes']} reader_reads={FIG['reader_reads']} "
        f"cli_reads={FIG['cli_reads']} reader_errors={FIG['reader_errors']} "
        f"stale_pinned_growth={FIG['stale_pinned']} stale_growth_after_check={FIG['stale_after']} "
        f"eio_campaign_faults={FIG['eio_campaign_faults']}"
    )


# --------------------------------------------------------------------- helpers




def block(step: int, size: int = BLOB) -> bytes:
    out = bytearray()
    i = 0
    while len(out) < size:
        out += hashlib.blake2b(f"{step}:{i}".encode(), digest_size=64).digest()
        i += 1
    return bytes(out[:size])


def expected(steps: int, size: int = BLOB) -> dict:
    blobs = [block(s, size) for s in range(steps)]
    return {"steps": steps, "bytes": steps * size, "sha": hashlib.sha256(b"".join(blobs)).hexdigest()}


def ledger_keys(path: Path) -> list[str]:
    try:
        return [line.partition(" ")[0] for line in path.read_text().splitlines()]
    except FileNotFoundError:
        return []


def agent(tmp_path: Path) -> str:
    script = tmp_path / "faults_grow_agent.py"
    script.write_text(GROW_AGENT)
    return str(script)


def cli_at(tmp_path: Path, store: Path, **env: str) -> Cli:
    cli = Cli(tmp_path, LEDGER=str(tmp_path / "ledger.txt"), **env)
    cli.store = store
    cli.env["TCC_STORE"] = str(store)
    return cli


def show(cli: Cli, run_id: str) -> dict:
    return json.loads(cli.run("show", "--json", run_id, check=True).stdout)


def assert_clear_store_error(proc: subprocess.CompletedProcess[str], store: Path) -> str:
    """Exit 1 and exactly one `tcc: error:` line naming the store; no traceback."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("tcc: error: "), proc.stderr
    assert str(store) in lines[0], lines[0]
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr
    assert "disk is full or failing" in lines[0] and "intact" in lines[0], lines[0]
    FIG["fault_errors"] += 1
    return lines[0]


def check_committed_then_finish(cli: Cli, script_steps: int, before: dict, failed_processes: int,
                                in_flight: set[int], size: int = BLOB, run_id: str = "r") -> None:
    """Nothing committed is lost; `tcc resume` completes exactly; dups only for the in-flight steps.

    ``in_flight``: the number of effects committed when each failure happened (the call
    after them was in flight).
    """
    after_fault = show(cli, run_id)
    assert after_fault["snapshots"] == before["snapshots"] and after_fault["effects"] == before["effects"]
    done = cli.run("resume", "--json", run_id, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["result"] == expected(script_steps, size)
    final = show(cli, run_id)
    assert final["status"] == "completed" and final["effects"] == script_steps
    keys = ledger_keys(Path(cli.env["LEDGER"]))
    counts = collections.Counter(keys)
    assert sorted(counts, key=lambda k: int(k.rpartition(":")[2])) == [
        f"{run_id}:{s}" for s in range(1, script_steps + 1)]
    dups = {k: n for k, n in counts.items() if n > 1}
    # only a call in flight when a commit failed may run again, once per process that failed
    assert set(dups) <= {f"{run_id}:{e + 1}" for e in in_flight}, (dups, in_flight)
    assert sum(n - 1 for n in dups.values()) <= failed_processes, dups
    FIG["reissued"] += sum(n - 1 for n in dups.values())
    FIG["resumed_exact"] += 1


# ------------------------------------------------------------- (a) disk full


@pytest.mark.timeout(240)
def test_disk_full_on_a_small_tmpfs_then_resume_after_it_grows(tmp_path):
    """A full tmpfs fails `tcc run` with one clear line; show/inspect still work; resume completes after remount."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt)],
                             capture_output=True, text=True, timeout=60)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip()}): needs root; "
                    "test_write_failing_with_efbig covers the same path without privileges")
    try:
        store = mnt / "store"
        cli = cli_at(tmp_path, store, BLOB=str(BLOB))
        failed = cli.run("run", "--run-id", "r", agent(tmp_path), str(STEPS), timeout=300)
        assert_clear_store_error(failed, store)
        assert shutil.disk_usage(mnt).free < 512 << 10  # it really was the disk that filled up
        # on the still-full disk: the run and its newest snapshot are readable
        before = show(cli, "r")
        assert before["status"] == "running" and before["effects"] >= 5, before
        assert before["snapshots"][-1]["number"] == before["effects"]
        inspected = json.loads(cli.run("inspect", "--json", "r", check=True).stdout)
        assert inspected["snapshot"] == before["effects"]
        assert inspected["frames"][-1]["locals"]["step"] == str(before["effects"] - 1)
        assert inspected["frames"][-1]["locals"]["steps"] == repr(str(STEPS))
        FIG["tmpfs_full_at"] = before["effects"]
        # resuming while the disk is still full fails the same clear way and loses nothing
        again = cli.run("resume", "r", timeout=300)
        assert_clear_store_error(again, store)
        still = show(cli, "r")
        assert still["effects"] >= before["effects"]
        assert {s["number"] for s in still["snapshots"]} >= {still["effects"]}
        remount = subprocess.run(["mount", "-o", "remount,size=64m", str(mnt)], capture_output=True,
                                 text=True, timeout=60)
        assert remount.returncode == 0, remount.stderr
        check_committed_then_finish(cli, STEPS, still, failed_processes=2,
                                    in_flight={before["effects"], still["effects"]})
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=60)


# -------------------------------------------- (b) failing writes and fsync


def _limit_file_size(limit: int):
    def preexec() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write() fails with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return preexec


@pytest.mark.timeout(240)
def test_write_failing_with_efbig_then_resume_without_the_limit(tmp_path):
    """Under RLIMIT_FSIZE the data file cannot grow: a clear error, then resume without the limit completes."""
    store = tmp_path / "store"
    cli = cli_at(tmp_path, store, BLOB=str(BLOB))
    failed = subprocess.run(cli.cmd("run", "--run-id", "r", agent(tmp_path), str(STEPS)), env=cli.env,
                            capture_output=True, text=True, timeout=300,
                            preexec_fn=_limit_file_size(3 << 20))
    assert_clear_store_error(failed, store)
    assert (store / "data.mdb").stat().st_size <= 3 << 20
    before = show(cli, "r")
    assert before["status"] == "running" and before["effects"] >= 5, before
    FIG["fsize_full_at"] = before["effects"]
    check_committed_then_finish(cli, STEPS, before, failed_processes=1, in_flight={before["effects"]})


SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

/* fsync/fdatasync fail with EIO while the file named by $TCC_FAULT_TRIGGER exists */
static int tripped(void) {
    const char *p = getenv("TCC_FAULT_TRIGGER");
    return p && access(p, F_OK) == 0;
}
int fdatasync(int fd) {
    static int (*real)(int);
    if (tripped()) { errno = EIO; return -1; }
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    return real(fd);
}
int fsync(int fd) {
    static int (*real)(int);
    if (tripped()) { errno = EIO; return -1; }
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    return real(fd);
}
"""


@pytest.fixture(scope="module")
def fsync_shim(tmp_path_factory) -> str:
    """An LD_PRELOAD library failing fsync/fdatasync with EIO on demand (skip without gcc)."""
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        pytest.skip("no C compiler to build the fsync fault shim")
    folder = tmp_path_factory.mktemp("shim")
    (folder / "shim.c").write_text(SHIM)
    built = subprocess.run([gcc, "-shared", "-fPIC", "-O2", "-o", str(folder / "shim.so"),
                            str(folder / "shim.c"), "-ldl"], capture_output=True, text=True, timeout=120)
    if built.returncode != 0:
        pytest.skip(f"cannot build the fsync fault shim: {built.stderr.strip()[:200]}")
    return str(folder / "shim.so")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("durability", ["sync", "group"])
def test_fsync_failing_with_eio_then_resume_after_it_clears(tmp_path, fsync_shim, durability):
    """fdatasync returning EIO fails the commit with a clear error; after the fault clears resume completes."""
    store = tmp_path / "store"
    trigger = tmp_path / "fsync-fails"
    steps, size = 60, 1024
    cli = cli_at(tmp_path, store, BLOB=str(size), DELAY="0.02", LD_PRELOAD=fsync_shim,
                 TCC_FAULT_TRIGGER=str(trigger), TCC_DURABILITY=durability)
    led = Path(cli.env["LEDGER"])
    proc = cli.popen("run", "--run-id", "r", agent(tmp_path), str(steps))
    try:
        wait_until(lambda: len(ledger_keys(led)) >= 8 or proc.poll() is not None, "the first effects")
        trigger.touch()
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    failed = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    line = assert_clear_store_error(failed, store)
    assert "Input/output error" in line, line  # the EIO came from the shim's fdatasync
    # while fsync still fails, a resume fails the same clear way (at its first commit: the claim)
    assert_clear_store_error(cli.run("resume", "r", timeout=300), store)
    trigger.unlink()
    before = show(cli, "r")
    assert before["status"] == "running" and 7 <= before["effects"] < steps, before  # 8th in flight
    assert before["epoch"] == 1  # the failed claim changed nothing
    FIG["eio_at"] = before["effects"]
    check_committed_then_finish(cli, steps, before, failed_processes=1, in_flight={before["effects"]},
                                size=size)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_fsync_eio_campaign(tmp_path, fsync_shim):
    """Slow tier: fsync fails TCC_SLOW_FAULT_CYCLES times during one run; each is clear, and it finishes exactly."""
    cycles = int(os.environ.get("TCC_SLOW_FAULT_CYCLES", "30"))
    steps, size = 20 * cycles + 40, 1024
    store = tmp_path / "store"
    trigger = tmp_path / "fsync-fails"
    cli = cli_at(tmp_path, store, BLOB=str(size), DELAY="0.005", LD_PRELOAD=fsync_shim,
                 TCC_FAULT_TRIGGER=str(trigger))
    led = Path(cli.env["LEDGER"])
    rng = random.Random(71)
    args: tuple[str, ...] = ("run", "--run-id", "r", agent(tmp_path), str(steps))
    in_flight: set[int] = set()
    failures = 0
    while True:
        proc = cli.popen(*args)
        args = ("resume", "r")
        target = len(ledger_keys(led)) + rng.randint(2, 15)
        faulted = False
        try:
            if failures < cycles:
                wait_until(lambda: len(ledger_keys(led)) >= target or proc.poll() is not None, "progress")
                if proc.poll() is None:
                    trigger.touch()
                    faulted = True
            out, err = proc.communicate(timeout=600)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        if trigger.exists():
            trigger.unlink()
        if proc.returncode == 0 and "completed:" in out:
            break
        assert faulted, (proc.returncode, err)
        assert_clear_store_error(subprocess.CompletedProcess(proc.args, proc.returncode, out, err), store)
        failures += 1
        in_flight.add(show(cli, "r")["effects"])
    final = show(cli, "r")
    assert final["status"] == "completed" and final["result"] == expected(steps, size)
    counts = collections.Counter(ledger_keys(led))
    assert set(counts) == {f"r:{s}" for s in range(1, steps + 1)}
    dups = {k: n for k, n in counts.items() if n > 1}
    assert set(dups) <= {f"r:{e + 1}" for e in in_flight}, (dups, in_flight)
    assert sum(n - 1 for n in dups.values()) <= failures
    FIG["eio_campaign_faults"] += failures
    FIG["reissued"] += sum(n - 1 for n in dups.values())
    FIG["resumed_exact"] += 1


# ------------------------------------------- (c) map growth under readers

READER = r"""
import json, os, sys
from tcc.store import open_store

path, stop = sys.argv[1], sys.argv[2]
store = open_store(path, create=False, map_size=1 << 20)
print("ready", store.map_size, flush=True)
reads = errors = 0
sizes = set()
messages = []


def read_all():
    for run in store.list_runs():
        snaps = store.snapshots(run.run_id)
        if snaps:
            store.load_snapshot(run.run_id, snaps[-1].number)
        store.journal(run.run_id)


while True:
    last = os.path.exists(stop)
    try:
        read_all()
        reads += 1
    except Exception as exc:
        errors += 1
        messages.append(f"{type(exc).__name__}: {exc}"[:300])
    sizes.add(store.map_size)
    if last:
        break
print(json.dumps({"reads": reads, "errors": errors, "sizes": sorted(sizes), "final": store.map_size,
                  "messages": messages[:5]}), flush=True)
store.close()
"""


@pytest.mark.timeout(240)
def test_map_growth_under_concurrent_readers(tmp_path):
    """A writer grows a 1 MiB map to many MiB while readers keep reading: no reader ever fails."""
    store = tmp_path / "store"
    script = agent(tmp_path)
    cli = cli_at(tmp_path, store, BLOB="65536", TCC_STORE_MAP_SIZE="1M")
    cli.run("run", "--run-id", "seed", script, "1", check=True)
    stop = tmp_path / "stop"
    reader = subprocess.Popen([sys.executable, "-c", READER, str(store), str(stop)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=cli.env)
    cli_failures: list[str] = []
    cli_reads = 0
    # the short-lived `tcc ls` / `tcc show` processes use the default map size, as users do
    plain = cli_at(tmp_path, store)
    plain.env.pop("TCC_STORE_MAP_SIZE", None)

    def cli_loop() -> None:
        nonlocal cli_reads
        while True:
            last = stop.exists()
            for args in (("ls",), ("show", "--json", "grow")):
                got = plain.run(*args, timeout=120)
                if got.returncode != 0 and "'grow'" not in got.stderr:  # before the run exists
                    cli_failures.append(got.stderr.strip()[:300])
                cli_reads += 1
            if last:
                return

    looper = threading.Thread(target=cli_loop, daemon=True)
    try:
        assert reader.stdout.readline().split()[0] == "ready", reader.stderr.read()
        looper.start()
        grown = cli.run("run", "--json", "--run-id", "grow", script, "60", timeout=300)
        assert grown.returncode == 0, grown.stderr
        assert json.loads(grown.stdout)["result"] == expected(60, 65536)
    finally:
        stop.touch()
        looper.join(timeout=120)
        out, err = reader.communicate(timeout=120)
    assert reader.returncode == 0, err
    got = json.loads(out.strip().splitlines()[-1])
    size = (store / "data.mdb").stat().st_size
    assert size > 4 << 20  # the map (1 MiB at the start) doubled at least three times
    assert got["errors"] == 0, got["messages"]
    assert got["final"] >= size, got  # the reader adopted the grown map
    assert not cli_failures, cli_failures
    FIG["map_bytes"] = size
    FIG["reader_reads"] += got["reads"]
    FIG["cli_reads"] += cli_reads
    FIG["reader_errors"] += got["errors"] + len(cli_failures)


PAUSED_OPENER = r"""
import sys

import lmdb

real_open = lmdb.open


def pausing_open(*args, **kwargs):
    env = real_open(*args, **kwargs)
    print("opened", flush=True)
    sys.stdin.readline()  # another process grows the store now
    return env


lmdb.open = pausing_open
from tcc.store import open_store

try:
    with open_store(sys.argv[1], create=False, map_size=1 << 20) as store:
        print("ok", len(store.list_runs()), flush=True)
except Exception as exc:
    print("error", type(exc).__name__, str(exc).replace("\n", " "), flush=True)
"""


@pytest.mark.timeout(120)
def test_opening_the_store_while_another_process_grows_it(tmp_path):
    """A process opening the store while another grows the map past its size opens it normally."""
    store = tmp_path / "store"
    script = agent(tmp_path)
    cli = cli_at(tmp_path, store, BLOB="65536", TCC_STORE_MAP_SIZE="1M")
    cli.run("run", "--run-id", "seed", script, "1", check=True)
    opener = subprocess.Popen([sys.executable, "-c", PAUSED_OPENER, str(store)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli.env)
    try:
        assert opener.stdout.readline().strip() == "opened", opener.stderr.read()
        cli.run("run", "--run-id", "grow", script, "40", check=True, timeout=300)
        assert (store / "data.mdb").stat().st_size > 2 << 20
        out, err = opener.communicate("go\n", timeout=60)
    finally:
        if opener.poll() is None:
            opener.kill()
            opener.communicate()
    assert out.startswith("ok"), (out, err)


# ------------------------------------------------------- (d) stale reader

WRITER = r"""
import hashlib, os, sys
from tcc.store import Completion, open_store

path = sys.argv[1]
store = open_store(path, keep=3)
store.create_run("w", run_id="w")
n = 0


def payload(i, size=49152):
    out = bytearray()
    b = 0
    while len(out) < size:
        out += hashlib.blake2b(f"{i}:{b}".encode(), digest_size=64).digest()
        b += 1
    return bytes(out[:size])


for line in sys.stdin:
    for _ in range(int(line)):
        seq = store.append_intent("w", 1, "x")
        store.checkpoint("w", 1, payload(n), completion=Completion(seq, result=b"r%d" % n))
        n += 1
    assert store.load_snapshot("w") == payload(n - 1)
    print(n, os.stat(os.path.join(path, "data.mdb")).st_size, flush=True)
store.close()
"""

STALE_READER = r"""
import sys, time
import lmdb

env = lmdb.open(sys.argv[1], max_dbs=16, readonly=True, lock=True)
txn = env.begin()  # a read transaction pinning the pages of this moment
print("holding", flush=True)
time.sleep(600)
"""


@pytest.mark.timeout(240)
@pytest.mark.parametrize("checker", ["gc", "ls"])
def test_stale_reader_killed_while_holding_old_pages(tmp_path, checker):
    """A reader SIGKILLed inside a read txn pins pages until an open's reader_check; then growth stops."""
    store = tmp_path / "store"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(store)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def commit(k: int) -> int:
        writer.stdin.write(f"{k}\n")
        writer.stdin.flush()
        line = writer.stdout.readline()
        assert line, writer.stderr.read()
        return int(line.split()[1])

    try:
        commit(60)
        warm = commit(60)  # retention keeps 3 snapshots: freed pages are reused, the file is steady
        stale = subprocess.Popen([sys.executable, "-c", STALE_READER, str(store)], stdout=subprocess.PIPE,
                                 text=True)
        assert stale.stdout.readline().strip() == "holding"
        stale.send_signal(signal.SIGKILL)
        stale.communicate(timeout=60)
        pinned = commit(60)
        # the dead reader's slot pins every page freed since: the file grows with each commit
        assert pinned - warm > 60 * 49152 // 2, (warm, pinned)
        ran = Cli(tmp_path).run(checker, "--store", str(store), timeout=120)
        assert ran.returncode == 0, ran.stderr
        after = commit(int(os.environ.get("TCC_FAULT_STALE_COMMITS", "150")))
        _out, err = writer.communicate(timeout=120)  # closes its stdin: it exits
        assert writer.returncode == 0, err
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.communicate()
    # once the slot is released, freed pages are reused again: bounded growth
    assert after <= pinned + max(pinned // 4, 2 << 20), (warm, pinned, after)
    FIG["stale_pinned"] = max(FIG["stale_pinned"], pinned - warm)
    FIG["stale_after"] = max(FIG["stale_after"], after - pinned)
