#!/usr/bin/env python
"""Generate the format fixtures under ``tests/fixtures/`` (see its README.md).

Run it only for a deliberate format change, and then *add* fixtures for the
new version; never regenerate the existing ones to make a test pass -- they
stand for snapshots and stores users already have.

Snapshot blobs (one set per interpreter; run with each interpreter)::

    .venv-3.11/bin/python scripts/make_fixtures.py snapshots
    .venv-3.12/bin/python scripts/make_fixtures.py snapshots
    .venv-3.13/bin/python scripts/make_fixtures.py snapshots

Stores of the format this checkout writes (plain and encrypted)::

    .venv-3.12/bin/python scripts/make_fixtures.py store --format 4
    .venv-3.12/bin/python scripts/make_fixtures.py store --format 4-encrypted

A killed ``tcc run`` of ``tests/fixtures/run_agent.py`` (the runtime's run state in
its snapshot; run with each interpreter)::

    .venv-3.12/bin/python scripts/make_fixtures.py runs

Stores of older formats, which only older code can write: for each version in
``OLD_FORMATS`` this makes a git worktree of the commit, a venv with that tcc
installed, and runs ``store --format N`` in it (keep the venvs with --keep)::

    .venv-3.12/bin/python scripts/make_fixtures.py old-stores

The store generator uses only store and capture calls that every tcc since
format 1 has (open_store, create_run(run_id=...), append_intent,
append_completion, checkpoint(completion=, consume_signal=), claim_run,
send_signal, take_signal, add_event, set_status, fork_run; dump_payload, seal,
loads), so that this one file runs against all of them.  Everything the
manifests record is read back through the generating tcc's own API.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import platform
import random
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
SNAPSHOTS = FIXTURES / "snapshots"
STORES = FIXTURES / "stores"
RUNS = FIXTURES / "runs"

# The programs are imported by this module name when the fixtures are loaded.
sys.path.insert(0, str(FIXTURES))
import snapshot_programs as programs  # noqa: E402

# Format version -> the last commit that wrote it (the commit before the one that
# introduced the next version: `git log -S'"version": N' -- src/tcc/store`).
OLD_FORMATS = {
    "1": "03cb74b1ed245de6d0e6ff23e6b5a983b222867c",  # 068fc23 introduced format 2
    "2": "85c2fb72c9f242e9ea6a2e384312bc06c956bb8a",  # 040d6dd introduced format 3
    "3": "6576407ef55110000857444df7c2866efcc153a8",  # 2cacaaa introduced format 4
}
CURRENT_FORMATS = ("4", "4-encrypted")
# A test key, public on purpose: it only protects the fixture store (README.md).
TEST_KEY_FILE = STORES / "v4-encrypted.testkey"

# The run fixtures (`runs`): one killed `tcc run` of tests/fixtures/run_agent.py per
# interpreter.  A run stores its script's absolute path and `tcc resume` loads the script
# from there, so the agent is run from this fixed path, outside any checkout, and the test
# puts the checked-in agent at the same path (README.md, "Run fixtures").
RUN_AGENT = FIXTURES / "run_agent.py"
RUN_AGENT_PATH = Path("/tmp/tcc-fixture-runs/run_agent.py")
RUN_CASE = "run_agent"
RUN_ID = "fixture-run"
RUN_ARGS = ["topic"]
RUN_SIGNALS = ("first", "second")  # the values of go@1 and go@2
# In the process resumed after go@1: the wait's answer (1), lookup (2) and score (3) are
# journaled, then the process SIGKILLs itself (the driver's TCC_TEST_KILL_AFTER hook).
RUN_KILL_AFTER = 3

# (name, program, args, asks made before the capture)
SNAPSHOT_CASES = [
    ("loop_with_locals", "loop_with_locals", [4], 2),
    ("nested_awaits", "nested_awaits", [], 3),
    ("generator", "numbers_generator", [4], 2),
    ("except_block", "in_except_block", ["x"], 2),
    ("closure", "with_closure", [10], 2),
]
SIGNAL_NAMES = ("approve", "later", "taken", "never")
TENANTS = ("default", "other")
RUN_FIELDS = ("run_id", "tenant", "entry", "args", "strategy", "status", "created", "updated",
              "epoch", "owner_host", "owner_pid", "lease_expiry", "result", "error", "parent")
JOURNAL_FIELDS = ("seq", "kind", "time", "name", "args", "idempotency_key", "attempt",
                  "intent_seq", "result", "error", "duration")


# ------------------------------------------------------------------- helpers


def tcc_about() -> dict[str, Any]:
    """The tcc and interpreter writing a fixture."""
    import tcc
    from tcc.capture import interpreter_tag

    src = Path(tcc.__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(src), "status", "--porcelain", "--", "."],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit, dirty = "unknown", ""
    return {
        "tcc_version": getattr(tcc, "__version__", "unknown"),
        "tcc_commit": commit + (" (with uncommitted changes)" if dirty else ""),
        "interpreter": interpreter_tag().decode(),
        "python": platform.python_version(),
    }


def jsonable(value: Any) -> Any:
    """Bytes as ``hex:...``, tuples as lists, mappings as dicts, recursively."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "hex:" + bytes(value).hex()
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, dict) or hasattr(value, "items"):
        return {str(k): jsonable(v) for k, v in value.items()}
    return value


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ----------------------------------------------------------------- snapshots


def _refuse_overwrite(path: Path, force: bool) -> bool:
    """Whether to skip ``path``: existing fixtures stand for data users have; replace them only
    with --force (and only if they were never released)."""
    if path.exists() and not force:
        print(f"{path} exists: kept (--force replaces it)")
        return True
    return False


def snapshot_fixtures(force: bool, root: Path = SNAPSHOTS) -> None:
    """Write this interpreter's snapshot blobs and their manifests (those missing)."""
    from tcc.capture import dumps, loads

    tag = sys.implementation.cache_tag
    out = root / tag
    out.mkdir(parents=True, exist_ok=True)
    about = tcc_about()
    for name, program, args, steps in SNAPSHOT_CASES:
        if _refuse_overwrite(out / f"{name}.tcc", force):
            continue
        func = getattr(programs, program)
        trace, result = programs.drive(func(*args))  # the uninterrupted run
        if json.loads(json.dumps(result)) != result:
            raise SystemExit(f"{program}: its result is not a plain JSON value: {result!r}")
        task = func(*args)
        pending = programs.advance(task, steps)
        blob = dumps({"task": task, "resume_with": pending})
        restored = loads(blob)
        if programs.drive(restored["task"], restored["resume_with"]) != (trace[steps:], result):
            raise SystemExit(f"{program}: the restored task does not finish as the original did")
        if programs.drive(task, pending) != (trace[steps:], result):
            raise SystemExit(f"{program}: the captured task does not finish as an uninterrupted one")
        (out / f"{name}.tcc").write_bytes(blob)
        write_json(out / f"{name}.json", {
            "blob": f"{name}.tcc",
            "blob_sha256": sha256(blob),
            "holds": "tcc.dumps({'task': <suspended task>, 'resume_with': <its answer>})",
            "program": f"snapshot_programs.{program}",
            "args": args,
            "asks_before_capture": steps,
            "expected_trace": trace[steps:],
            "expected_result": result,
            "snapshot_format_version": 1,
            **about,
        })
        print(f"{out / name}.tcc: {len(blob)} bytes")


# -------------------------------------------------------------------- stores


def _snapshot_payload(state: Any) -> bytes:
    """A snapshot as the runtime stores it: an uncompressed sealed blob."""
    from tcc.capture import dump_payload, seal

    return seal(dump_payload(state), compress=False)


def _data_state(step: int) -> dict[str, Any]:
    """A snapshot of plain data, large enough (> 8 KiB) to be chunked."""
    text = "".join(f"{i:05d} the quick brown fox jumps over {i * i}\n" for i in range(400))
    return {"data": text, "noise": random.Random(7).randbytes(2048), "step": step}


def populate_store(path: str, key: str | None) -> None:
    """Write the fixture runs with this tcc's store API (the same calls for every version)."""
    from tcc.capture import dump_payload
    from tcc.store import Completion, open_store

    extra = {"key": key} if key is not None else {}
    store = open_store(path, create=True, **extra)
    try:
        a = "fixture-run-a"
        store.create_run("snapshot_programs:loop_with_locals", dump_payload(((4,), {})), run_id=a)
        first = store.append_intent(a, 1, "fetch", dump_payload((("page", 1), {})),
                                    idempotency_key="fetch-1")
        task = programs.loop_with_locals(4)
        pending = programs.advance(task, 2)
        store.checkpoint(a, 1, _snapshot_payload({"task": task, "resume_with": pending}),
                         completion=Completion(first, result=dump_payload("page one"), duration=0.25))
        epoch = store.claim_run(a, steal=True).epoch  # taken over: epoch 2
        second = store.append_intent(a, epoch, "fetch", dump_payload((("page", 2), {})), attempt=2)
        store.append_completion(a, epoch, Completion(second, error=dump_payload("boom"), duration=0.5))
        store.send_signal(a, "approve", dump_payload("yes"))
        store.send_signal(a, "later", dump_payload({"n": 1}))
        store.send_signal(a, "taken", b"raw signal value")
        store.take_signal(a, epoch, "taken")
        store.checkpoint(a, epoch, _snapshot_payload(_data_state(2)), consume_signal="approve")
        store.checkpoint(a, epoch, _snapshot_payload(_data_state(3)))  # shares chunks with 2
        store.add_event(a, "note", {"step": 3, "text": "fixture", "nested": {"list": [1, 2]}})
        store.set_status(a, epoch, "waiting")

        b = "fixture-run-b"
        store.create_run("snapshot_programs:with_closure", dump_payload(((10,), {})), run_id=b)
        task = programs.with_closure(10)
        pending = programs.advance(task, 2)
        store.checkpoint(b, 1, _snapshot_payload({"task": task, "resume_with": pending}))
        store.set_status(b, 1, "completed", result=dump_payload({"done": True}))
        store.fork_run(b, 1, new_run_id="fixture-run-c")  # pins b's snapshot 1
    finally:
        store.close()
    other = open_store(path, tenant="other", create=False, **extra)
    try:
        o = "fixture-run-other"
        other.create_run("other:main", b"", run_id=o)
        other.append_intent(o, 1, "fetch", b"other args")
        other.add_event(o, "note", {"tenant": "other"})
    finally:
        other.close()


def describe_store(path: str, key: str | None) -> dict[str, Any]:
    """Everything the fixture runs hold, read through this tcc's API, as JSON values.

    tests/store/test_old_stores.py reads the same through the current API and
    compares it with this.
    """
    from tcc.store import open_store

    extra = {"key": key} if key is not None else {}
    out: dict[str, Any] = {}
    for tenant in TENANTS:
        store = open_store(path, tenant=tenant, create=False, **extra)
        try:
            runs: dict[str, Any] = {}
            for info in sorted(store.list_runs(), key=lambda r: r.run_id):
                rid = info.run_id
                runs[rid] = {
                    "run": jsonable({f: getattr(info, f) for f in RUN_FIELDS}),
                    "journal": [jsonable({f: getattr(r, f) for f in JOURNAL_FIELDS})
                                for r in store.journal(rid)],
                    "snapshots": [
                        {"number": s.number, "journal_len": s.journal_len, "size": s.size,
                         "created": s.created, "pinned": s.pinned,
                         "sha256": sha256(store.load_snapshot(rid, s.number))}
                        for s in store.snapshots(rid)],
                    "signals": {name: {"state": store.signal_state(rid, name),
                                       "value": jsonable(store.peek_signal(rid, name))}
                                for name in SIGNAL_NAMES},
                    "pending_signals": sorted(store.pending_signals(rid)),
                    "events": [{"seq": e.seq, "kind": e.kind, "time": e.time, "data": jsonable(e.data)}
                               for e in store.events(rid)],
                }
            out[tenant] = runs
        finally:
            store.close()
    return out


def snapshot_meaning(payload: bytes) -> dict[str, Any]:
    """What a fixture snapshot holds, once loaded (on the interpreter that wrote it)."""
    from tcc.capture import loads

    state = loads(payload)
    if "task" in state:
        trace, result = programs.drive(state["task"], state["resume_with"])
        return {"trace": trace, "result": result}
    return {"data_sha256": sha256(state["data"].encode() + state["noise"]), "step": state["step"]}


def read_format_header(path: str) -> dict[str, Any]:
    """The store's format header, read with LMDB directly (the store must be closed)."""
    import lmdb

    env = lmdb.open(path, readonly=True, lock=False, subdir=True, max_dbs=16)
    try:
        meta = env.open_db(b"meta", create=False)
        with env.begin() as txn:
            raw = txn.get(b"format", db=meta)
    finally:
        env.close()
    header: dict[str, Any] = json.loads(bytes(raw))
    return header


def _compact_copy(src: str, dst: str) -> None:
    """data.mdb without free pages (LMDB's compacting copy), plus the store secret."""
    import lmdb

    os.mkdir(dst, 0o700)
    env = lmdb.open(src, readonly=True, lock=False, subdir=True, max_dbs=16)
    try:
        env.copy(dst, compact=True)
    finally:
        env.close()
    shutil.copyfile(os.path.join(src, "secret"), os.path.join(dst, "secret"))


def _write_tar(directory: str, target: Path) -> None:
    """A reproducible tar.gz of the store files (no times, owners or modes to trust)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(os.listdir(directory)):
            data = Path(directory, name).read_bytes()
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o600, 0
            tar.addfile(info, io.BytesIO(data))
    with open(target, "wb") as f, gzip.GzipFile(fileobj=f, mode="wb", mtime=0, filename="") as gz:
        gz.write(buf.getvalue())


def store_fixture(fmt: str, out: Path, force: bool) -> None:
    """Make the fixture store of format ``fmt`` with the tcc this interpreter imports."""
    if _refuse_overwrite(out / f"v{fmt}.tar.gz", force):
        return
    from tcc.store import open_store

    key = TEST_KEY_FILE.read_text().strip() if fmt == "4-encrypted" else None
    extra = {"key": key} if key is not None else {}
    with tempfile.TemporaryDirectory() as tmp:
        live = os.path.join(tmp, "store")
        populate_store(live, key)
        contents = describe_store(live, key)
        header = read_format_header(live)
        if str(header.get("version")) != fmt:
            raise SystemExit(f"this tcc wrote a store of format {header.get('version')}, not {fmt}: "
                             "run the old formats' generator with their own tcc (old-stores)")
        meanings = {}
        for tenant, runs in contents.items():
            with open_store(live, tenant=tenant, create=False, **extra) as store:
                for rid, run in runs.items():
                    for snap in run["snapshots"]:
                        payload = store.load_snapshot(rid, snap["number"])
                        meanings[f"{tenant}/{rid}/{snap['number']}"] = snapshot_meaning(payload)
        compact = os.path.join(tmp, "compact")
        _compact_copy(live, compact)
        out.mkdir(parents=True, exist_ok=True)
        name = f"v{fmt}"
        _write_tar(compact, out / f"{name}.tar.gz")
        write_json(out / f"{name}.json", {
            "archive": f"{name}.tar.gz",
            "archive_sha256": sha256((out / f"{name}.tar.gz").read_bytes()),
            "format_version": header["version"],
            "key_file": TEST_KEY_FILE.name if key is not None else None,
            "contents": contents,
            "snapshot_meanings": meanings,
            **tcc_about(),
        })
        print(f"{out / name}.tar.gz: {(out / f'{name}.tar.gz').stat().st_size} bytes, "
              f"format {header['version']}")


def old_store_fixtures(formats: list[str], keep: bool, force: bool, out: Path = STORES) -> None:
    """Build each old format's store with the commit that wrote it (worktree + venv)."""
    python = getattr(sys, "_base_executable", sys.executable)
    for fmt in formats:
        commit = OLD_FORMATS[fmt]
        short = commit[:7]
        tree, venv = Path(f"/tmp/wt-{short}"), Path(f"/tmp/venv-{short}")
        made_tree = not tree.exists()
        if made_tree:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), commit],
                           check=True)
        try:
            if not (venv / "bin" / "python").exists():
                subprocess.run([python, "-m", "venv", str(venv)], check=True)
                subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "-e", str(tree)], check=True,
                               env={**os.environ, "TCC_REQUIRE_NATIVE": "1"})
            subprocess.run([str(venv / "bin" / "python"), str(Path(__file__).resolve()), "store",
                            "--format", fmt, "--out", str(out), *(["--force"] if force else [])],
                           check=True)
        finally:
            if not keep:
                shutil.rmtree(venv, ignore_errors=True)
                if made_tree:
                    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                                   check=True)


# ---------------------------------------------------------------------- runs


def place_run_agent(path: Path = RUN_AGENT_PATH) -> None:
    """Put the checked-in agent at ``path``, in a directory of this user's that no one else
    can write to (made 0700 if missing); the file is replaced atomically, and only if it
    differs, so concurrent callers with the same agent never see a partial file."""
    folder = path.parent
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise SystemExit(f"{folder} is not a directory of this user's: cannot place the agent there")
    if stat.S_IMODE(st.st_mode) & 0o022:
        os.chmod(folder, 0o700)
    data = RUN_AGENT.read_bytes()
    try:
        if path.read_bytes() == data:
            return
    except FileNotFoundError:
        pass
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".run_agent.", suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _tcc(store: str, *args: str, ledger: str, ok: tuple[int, ...] = (0,),
         **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m tcc CMD --store STORE ARGS`` with this interpreter, no TCC_* settings
    but ``env`` (and the agent's ledger)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TCC_")}
    clean.update(env, TCC_FIXTURE_LEDGER=ledger)
    command, *rest = args
    proc = subprocess.run([sys.executable, "-m", "tcc", command, "--store", store, *rest],
                          env=clean, cwd=os.path.dirname(store), capture_output=True, text=True,
                          timeout=300)
    if proc.returncode not in ok:
        raise SystemExit(f"tcc {' '.join(args)} exited {proc.returncode}, not {ok}:\n"
                         f"{proc.stdout}\n{proc.stderr}")
    return proc


def _ledger_lines(path: str) -> list[str]:
    try:
        return Path(path).read_text().splitlines()
    except FileNotFoundError:
        return []


def _journal(store_path: str) -> list[dict[str, Any]]:
    """The run's journal as this tcc reads it (no times): kind, key, name, the intents'
    arguments and the completions' outcomes."""
    from tcc.capture import load_payload
    from tcc.store import open_store

    with open_store(store_path, create=False) as store:
        return [{"seq": r.seq, "kind": r.kind, "idempotency_key": r.idempotency_key, "name": r.name,
                 "attempt": r.attempt, "intent_seq": r.intent_seq,
                 "args": jsonable(load_payload(r.args)) if r.kind == "intent" and r.args else None,
                 "result": jsonable(load_payload(r.result)) if r.result is not None else None,
                 "error": repr(load_payload(r.error)) if r.error is not None else None}
                for r in store.journal(RUN_ID)]


def _run_state(store_path: str) -> dict[str, Any]:
    """What the run's newest snapshot holds, read through this tcc (the tuple tagged
    ``tcc-run-state``: version, coroutine, resumption, calls, waits, module globals)."""
    from tcc.capture import load_payload, unseal
    from tcc.runtime import load_script
    from tcc.store import open_store

    load_script(str(RUN_AGENT_PATH))  # the snapshot names its functions by this module
    with open_store(store_path, create=False) as store:
        info = store.snapshots(RUN_ID)[-1]
        stored = load_payload(unseal(store.load_snapshot(RUN_ID, info.number), authenticated=True))
        run = store.get_run(RUN_ID)
        pending = sorted(store.pending_signals(RUN_ID))
    tag, version, coro, resumption, calls, *rest = stored
    frames, link = [], coro
    while link is not None:  # the suspended chain, outermost first, as this tcc rebuilt it
        frame = getattr(link, "cr_frame", None) or getattr(link, "gi_frame", None)
        if frame is None:
            break
        frames.append(frame.f_code.co_qualname)
        link = getattr(link, "cr_await", None) or getattr(link, "gi_yieldfrom", None)
    return {
        "run": {"entry": run.entry, "args": json.loads(run.args), "status": run.status,
                "epoch": run.epoch, "strategy": run.strategy},
        "snapshot": {"number": info.number, "journal_len": info.journal_len},
        "pending_signals": pending,
        "state": {
            "tag": tag, "version": version, "items": len(stored),
            "coroutine": type(stored[2]).__name__, "frames": frames,
            "resumption": jsonable(list(resumption)), "calls": calls,
            "waits": rest[0] if rest else None,
            "module_state": jsonable(rest[1]) if len(rest) > 1 else None,
        },
    }


def run_fixture(force: bool, root: Path = RUNS) -> None:
    """This interpreter's killed run of the fixture agent, and its manifest."""
    tag = sys.implementation.cache_tag
    out = root / tag
    if _refuse_overwrite(out / f"{RUN_CASE}.tar.gz", force):
        return
    place_run_agent()
    agent = str(RUN_AGENT_PATH)
    first, second = (json.dumps(v) for v in RUN_SIGNALS)
    with tempfile.TemporaryDirectory() as tmp:
        # The uninterrupted run: parks at go@1 and go@2, is signalled and resumed each time.
        full, full_ledger = os.path.join(tmp, "full", "store"), os.path.join(tmp, "full.ledger")
        os.mkdir(os.path.dirname(full), 0o700)
        _tcc(full, "run", "--json", "--run-id", RUN_ID, agent, *RUN_ARGS, ledger=full_ledger)
        _tcc(full, "signal", RUN_ID, "go", "--value", first, ledger=full_ledger)
        _tcc(full, "resume", "--json", RUN_ID, ledger=full_ledger)
        _tcc(full, "signal", RUN_ID, "go", "--value", second, ledger=full_ledger)
        done = json.loads(_tcc(full, "resume", "--json", RUN_ID, ledger=full_ledger).stdout)
        if done["status"] != "completed":
            raise SystemExit(f"the uninterrupted run ended {done['status']}: {done}")
        expected = done["result"]
        full_calls = _ledger_lines(full_ledger)
        full_intents = [(r["idempotency_key"], r["name"]) for r in _journal(full) if r["kind"] == "intent"]

        # The fixture: the same, but the resume after go@1 is killed after RUN_KILL_AFTER steps;
        # go@2 is then signalled (a pending signal in the fixture).
        live, ledger = os.path.join(tmp, "live", "store"), os.path.join(tmp, "live.ledger")
        os.mkdir(os.path.dirname(live), 0o700)
        parked = json.loads(_tcc(live, "run", "--json", "--run-id", RUN_ID, agent, *RUN_ARGS,
                                 ledger=ledger).stdout)
        if parked["status"] != "waiting":
            raise SystemExit(f"the run did not park at go@1: {parked}")
        _tcc(live, "signal", RUN_ID, "go", "--value", first, ledger=ledger)
        killed = _tcc(live, "resume", "--json", RUN_ID, ledger=ledger, ok=(-9,),
                      TCC_TEST_KILL_AFTER=str(RUN_KILL_AFTER))
        _tcc(live, "signal", RUN_ID, "go", "--value", second, ledger=ledger)
        before = _ledger_lines(ledger)
        if full_calls[:len(before)] != before:
            raise SystemExit(f"the killed run made other calls than the uninterrupted one: {before}")
        journal = _journal(live)
        state = _run_state(live)
        inspected = json.loads(_tcc(live, "inspect", "--json", RUN_ID, ledger=ledger).stdout)

        compact = os.path.join(tmp, "compact")
        _compact_copy(live, compact)
        out.mkdir(parents=True, exist_ok=True)
        archive = out / f"{RUN_CASE}.tar.gz"
        _write_tar(compact, archive)

        # What the test will do: the packed store resumes to the uninterrupted run's result,
        # issuing only the calls after the kill.
        check, check_ledger = os.path.join(tmp, "check", "store"), os.path.join(tmp, "check.ledger")
        os.makedirs(check, 0o700)
        os.chmod(os.path.dirname(check), 0o700)
        with tarfile.open(archive, "r:gz") as tar:
            for member in tar.getmembers():
                fd = os.open(os.path.join(check, member.name), os.O_WRONLY | os.O_CREAT | os.O_EXCL,
                             0o600)
                src = tar.extractfile(member)
                assert src is not None
                with os.fdopen(fd, "wb") as f:
                    f.write(src.read())
        resumed = json.loads(_tcc(check, "resume", "--json", RUN_ID, ledger=check_ledger).stdout)
        resumed_intents = [(r["idempotency_key"], r["name"]) for r in _journal(check)
                           if r["kind"] == "intent"]
        if (resumed["status"], resumed["result"]) != ("completed", expected):
            archive.unlink()
            raise SystemExit(f"the packed run does not resume to {expected}: {resumed}")
        if _ledger_lines(check_ledger) != full_calls[len(before):] or resumed_intents != full_intents:
            archive.unlink()
            raise SystemExit(f"the packed run's resume made other calls: {_ledger_lines(check_ledger)}")

        from tcc.runtime._driver import STATE_TAG

        write_json(out / f"{RUN_CASE}.json", {
            "archive": archive.name,
            "archive_sha256": sha256(archive.read_bytes()),
            "agent": RUN_AGENT.name,
            "agent_sha256": sha256(RUN_AGENT.read_bytes()),
            "agent_path": str(RUN_AGENT_PATH),
            "run_id": RUN_ID,
            "args": RUN_ARGS,
            "made_by": [
                f"tcc run --run-id {RUN_ID} {RUN_AGENT_PATH} {' '.join(RUN_ARGS)}  # parks at go@1",
                f"tcc signal {RUN_ID} go --value '{first}'",
                f"TCC_TEST_KILL_AFTER={RUN_KILL_AFTER} tcc resume {RUN_ID}  # SIGKILLed",
                f"tcc signal {RUN_ID} go --value '{second}'  # pending for go@2",
            ],
            "kill_after": RUN_KILL_AFTER,
            "killed_exit": killed.returncode,
            "state_tag": STATE_TAG,
            "at_kill": {**state, "journal": journal, "calls_made": before},
            "inspect": {"frames": [f["function"] for f in inspected["frames"]],
                        "awaiting": inspected.get("awaiting"),
                        "globals": inspected.get("globals")},
            "expected_result": expected,
            "expected_calls_on_resume": full_calls[len(before):],
            "uninterrupted": {"calls": full_calls, "intents": [list(i) for i in full_intents]},
            **tcc_about(),
        })
        print(f"{archive}: {archive.stat().st_size} bytes; killed after {len(before)} of "
              f"{len(full_calls)} effect calls; resumes to {expected}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    snaps = sub.add_parser("snapshots", help="this interpreter's snapshot blobs")
    store = sub.add_parser("store", help="one store, written by the tcc this interpreter imports")
    store.add_argument("--format", required=True, choices=[*OLD_FORMATS, *CURRENT_FORMATS])
    runs = sub.add_parser("runs", help="this interpreter's killed `tcc run` of run_agent.py")
    old = sub.add_parser("old-stores", help="the old formats' stores, each by its own commit")
    old.add_argument("--format", action="append", choices=list(OLD_FORMATS))
    old.add_argument("--keep", action="store_true", help="keep the worktrees and venvs in /tmp")
    for p, default in ((snaps, SNAPSHOTS), (store, STORES), (runs, RUNS), (old, STORES)):
        p.add_argument("--force", action="store_true", help="replace existing fixtures (see README)")
        p.add_argument("--out", type=Path, default=default, help=f"where to write (default {default})")
    args = parser.parse_args(argv)
    if args.what == "snapshots":
        snapshot_fixtures(args.force, args.out)
    elif args.what == "runs":
        run_fixture(args.force, args.out)
    elif args.what == "store":
        import tcc

        print(f"tcc from {Path(tcc.__file__).resolve().parent}")
        store_fixture(args.format, args.out, args.force)
    else:
        old_store_fixtures(args.format or list(OLD_FORMATS), args.keep, args.force, args.out)


if __name__ == "__main__":
    main()
