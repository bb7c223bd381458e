"""Encryption at rest, and secrets kept out of snapshots (issue 25, finding 4).

A copied store directory showed, under ``grep -a``, the API key given to
``tcc.resource``, prompts, an effect-argument token, a bearer token held in a
local, and results.  With a store key (``TCC_STORE_KEY_FILE``) every record and
chunk is encrypted, and ``tcc.env("NAME")`` keeps an API key out of snapshots
and journals altogether, encrypted or not.

The first test is the acceptance test: an agent run through the real CLI,
SIGKILLed after its second step and resumed, then every byte of every file of
the store searched -- as UTF-8 (how pickles hold text), UTF-16, and inside
every zstd frame carved out of the files -- for each plaintext token.  The
same run on a plain store finds them (the search works), except the
``tcc.env`` key, which is in neither.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import pickle
import random
import subprocess
import sys
import textwrap
from typing import Any

import lmdb
import pytest
import zstandard

import tcc
from tcc.errors import StoreCorruptError, StoreError, StoreInsecureError, UsageError
from tcc.store import Completion, open_store
from tcc.store._codec import Sealer

pytest.importorskip("cryptography", reason="encryption at rest needs tcc[encryption]")

KEY_VARS = ("TCC_STORE_KEY_FILE", "TCC_STORE_KEY")

AGENT = '''\
import os

import tcc


class Client:
    """A stand-in API client: it refuses to be built without the real key."""

    def __init__(self, api_key):
        if api_key != os.environ["EXPECTED_KEY"]:
            raise RuntimeError("the client was built without the real key")
        self._key = api_key

    def complete(self, prompt, token):
        return f"RESULT-{os.environ['MARK']}-{prompt[-7:]}-{token[-4:]}"


@tcc.effect
def llm(client, prompt, token):
    return client.complete(prompt, token)


async def main(steps):
    client = tcc.resource(Client, api_key=tcc.env("X_API_KEY"))
    bearer = "Bearer " + os.environ["BEARER"]       # a token held in a local across checkpoints
    token = os.environ["EFFECT_TOKEN"]                # a token passed to an effect
    answers = []
    for i in range(int(steps)):
        prompt = f"PROMPT-{os.environ['MARK']}-step{i:03d}"
        answers.append(await llm(client, prompt, token))
    return [bearer[-6:], answers]
'''

# The tokens, distinctive and found nowhere in tcc itself.  The API key reaches the agent
# only through tcc.env; EXPECTED_KEY (a copy the test client checks against) is not used by
# the agent's own code.
API_KEY = "sk-apikey-" + hashlib.sha256(b"api").hexdigest()[:24]
BEARER = "bearer-tok-" + hashlib.sha256(b"bearer").hexdigest()[:24]
EFFECT_TOKEN = "effect-tok-" + hashlib.sha256(b"effect").hexdigest()[:24]
MARK = "mk" + hashlib.sha256(b"mark").hexdigest()[:10]
STEPS = 5
PROMPTS = [f"PROMPT-{MARK}-step{i:03d}" for i in range(STEPS)]
RESULTS = [f"RESULT-{MARK}-step{i:03d}-{EFFECT_TOKEN[-4:]}" for i in range(STEPS)]


def key_file(directory: pathlib.Path, name: str = "store.key", mode: int = 0o600) -> pathlib.Path:
    path = directory / name
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "w") as fh:
        fh.write(os.urandom(32).hex() + "\n")
    os.chmod(path, mode)
    return path


@pytest.fixture(autouse=True)
def _no_key_from_outside(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test here chooses its keys itself (TCC_TEST_ENCRYPT may have set one)."""
    for var in KEY_VARS:
        monkeypatch.delenv(var, raising=False)


def tcc_cmd(store: pathlib.Path, *args: str, key: pathlib.Path | None = None,
            **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k not in KEY_VARS}
    full.update(TCC_STORE=str(store), X_API_KEY=API_KEY, EXPECTED_KEY=API_KEY, BEARER=BEARER,
                EFFECT_TOKEN=EFFECT_TOKEN, MARK=MARK, **env)
    if key is not None:
        full["TCC_STORE_KEY_FILE"] = str(key)
    return subprocess.run([sys.executable, "-m", "tcc", *args], env=full, capture_output=True,
                          text=True, timeout=120)


def crash_and_resume(tmp: pathlib.Path, store: pathlib.Path, key: pathlib.Path | None) -> None:
    """Run the agent, SIGKILLed after its 2nd journaled step; resume it to the end; read it."""
    agent = tmp / "agent.py"
    agent.write_text(AGENT)
    died = tcc_cmd(store, "run", "--run-id", "r1", str(agent), str(STEPS), key=key,
                   TCC_TEST_KILL_AFTER="2")
    assert died.returncode == -9, (died.returncode, died.stderr)
    done = tcc_cmd(store, "resume", "--json", "r1", key=key)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1])["result"] == [BEARER[-6:], RESULTS]
    shown = tcc_cmd(store, "show", "--json", "r1", key=key)
    assert shown.returncode == 0 and json.loads(shown.stdout)["status"] == "completed", shown.stderr
    gc = tcc_cmd(store, "gc", "--compact", key=key)
    assert gc.returncode == 0, gc.stderr


def carved_zstd(data: bytes) -> bytes:
    """Everything that decompresses from a zstd frame starting anywhere in ``data``."""
    out = []
    at = data.find(b"\x28\xb5\x2f\xfd")
    while at >= 0:
        try:
            out.append(zstandard.ZstdDecompressor().decompressobj().decompress(data[at:at + (8 << 20)]))
        except zstandard.ZstdError:
            pass
        at = data.find(b"\x28\xb5\x2f\xfd", at + 1)
    return b"".join(out)


def occurrences(store: pathlib.Path, token: str) -> int:
    """How often ``token`` appears in the store's files: as UTF-8 (what pickles and JSON hold),
    UTF-16 (either order), or inside a zstd frame found in a file."""
    forms = [token.encode(), token.encode("utf-16-le"), token.encode("utf-16-be"),
             pickle.dumps(token, protocol=4)[3:-1]]  # the str's opcode, length and bytes
    files = [p for p in store.rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {"data.mdb", "secret"}, files
    found = 0
    for path in files:
        data = path.read_bytes()
        blob = data + b"\x00" + carved_zstd(data)
        found += sum(blob.count(form) for form in forms)
    return found


def test_no_plaintext_token_survives_in_an_encrypted_store(tmp_path: pathlib.Path) -> None:
    """The acceptance test: an agent run with TCC_STORE_KEY_FILE (crashed after its 2nd step,
    resumed, shown, compacted) leaves none of its tokens in any store file; the same run
    on a plain store shows every one of them but the tcc.env key, which is in neither."""
    key = key_file(tmp_path)
    plain, encrypted = tmp_path / "plain", tmp_path / "encrypted"
    crash_and_resume(tmp_path, plain, None)
    crash_and_resume(tmp_path, encrypted, key)
    tokens = {"bearer token in a local": BEARER, "effect-argument token": EFFECT_TOKEN,
              **{f"prompt {i}": p for i, p in enumerate(PROMPTS)},
              **{f"result {i}": r for i, r in enumerate(RESULTS)},
              "agent's entry": "agent.py", "effect name": "_agent:llm", "env variable name": "X_API_KEY"}
    in_plain = {what: occurrences(plain, token) for what, token in tokens.items()}
    assert all(in_plain.values()), in_plain  # the search finds what a plain store holds
    in_encrypted = {what: n for what, token in tokens.items() if (n := occurrences(encrypted, token))}
    assert in_encrypted == {}, in_encrypted
    # the key given through tcc.env is recorded by name only: in neither store
    assert occurrences(plain, API_KEY) == 0
    assert occurrences(encrypted, API_KEY) == 0
    # nor is the key file's content
    assert occurrences(encrypted, key.read_text().strip()) == 0


# ------------------------------------------------------------------ keys and clear refusals


def _files(store: pathlib.Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(store.iterdir())
            if p.is_file() and p.name in ("data.mdb", "secret")}


def test_a_missing_or_wrong_key_is_refused_and_changes_nothing(tmp_path: pathlib.Path) -> None:
    """An encrypted store opened without its key, or with another, is refused with one clear
    error naming what to do, in the API and on the command line, and is left as it was."""
    store = tmp_path / "s"
    right, wrong = os.urandom(32), os.urandom(32)
    with open_store(store, key=right) as s:
        assert s.encrypted
        run = s.create_run("e", b"args", run_id="r")
        s.checkpoint("r", run.epoch, b"state" * 5000)
    before = _files(store)
    with pytest.raises(StoreError, match="is encrypted; set TCC_STORE_KEY_FILE"):
        open_store(store)
    with pytest.raises(StoreError, match="wrong key; nothing was read or changed"):
        open_store(store, key=wrong)
    assert _files(store) == before
    bad = key_file(tmp_path, "wrong.key")
    for key, needle in ((None, "is encrypted; set TCC_STORE_KEY_FILE"), (bad, "wrong key")):
        proc = tcc_cmd(store, "ls", key=key)
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        assert proc.returncode == 1 and len(lines) == 1 and lines[0].startswith("tcc: error:"), proc
        assert needle in lines[0] and "Traceback" not in proc.stderr
    assert _files(store) == before
    with open_store(store, key=right.hex()) as s:  # 64 hex digits: the same key
        assert s.load_snapshot("r") == b"state" * 5000 and s.get_run("r").args == b"args"


def test_a_plain_store_opened_with_a_key_is_refused_and_changes_nothing(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A key never encrypts an existing plain store, and never opens it either: the
    refusal says to unset the key (a key meant for another store must not be ignored)."""
    store = tmp_path / "s"
    with open_store(store) as s:
        assert not s.encrypted
        s.create_run("e", run_id="r")
    before = _files(store)
    monkeypatch.setenv("TCC_STORE_KEY_FILE", str(key_file(tmp_path)))
    with pytest.raises(StoreError, match="is not encrypted, but a key was given"):
        open_store(store)
    proc = tcc_cmd(store, "ls", key=key_file(tmp_path, "other.key"))
    assert proc.returncode == 1 and "is not encrypted, but a key was given" in proc.stderr
    assert _files(store) == before
    monkeypatch.delenv("TCC_STORE_KEY_FILE")
    with open_store(store) as s:
        assert [r.run_id for r in s.list_runs()] == ["r"]


def test_key_sources_and_their_checks(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A key file must be this user's and closed to others; keys are 32 bytes or 64 hex
    digits; both variables at once are refused; the key is never shown."""
    from tcc.store._crypt import resolve_key

    hexed = key_file(tmp_path)
    raw = tmp_path / "raw.key"
    raw.write_bytes(os.urandom(32))
    os.chmod(raw, 0o400)
    for path in (hexed, raw):
        monkeypatch.setenv("TCC_STORE_KEY_FILE", str(path))
        found = resolve_key()
        assert found is not None and len(found.key) == 32
        assert found.key.hex() not in repr(found) and "TCC_STORE_KEY_FILE" in repr(found)
    os.chmod(hexed, 0o640)
    monkeypatch.setenv("TCC_STORE_KEY_FILE", str(hexed))
    with pytest.raises(StoreInsecureError, match="mode 640.*chmod 600"):
        resolve_key()
    if os.geteuid() == 0:
        os.chmod(hexed, 0o600)
        os.chown(hexed, 65534, -1)
        with pytest.raises(StoreInsecureError, match="belongs to uid 65534"):
            resolve_key()
    monkeypatch.setenv("TCC_STORE_KEY_FILE", str(tmp_path))
    with pytest.raises(StoreInsecureError, match="not a regular file"):
        resolve_key()
    monkeypatch.setenv("TCC_STORE_KEY_FILE", str(tmp_path / "missing"))
    with pytest.raises(StoreError, match="cannot read the store key file"):
        resolve_key()
    monkeypatch.delenv("TCC_STORE_KEY_FILE")
    monkeypatch.setenv("TCC_STORE_KEY", "ab" * 32)
    assert resolve_key().key == bytes.fromhex("ab" * 32)  # type: ignore[union-attr]
    monkeypatch.setenv("TCC_STORE_KEY_FILE", str(raw))
    with pytest.raises(UsageError, match="both TCC_STORE_KEY_FILE and TCC_STORE_KEY"):
        resolve_key()
    monkeypatch.delenv("TCC_STORE_KEY_FILE")
    for bad in ("ab" * 31, "zz" * 32, "secret passphrase"):
        monkeypatch.setenv("TCC_STORE_KEY", bad)
        with pytest.raises(UsageError, match="TCC_STORE_KEY must be"):
            resolve_key()
    for bad_key in (b"short", 12345, "ab" * 33, b"0123456789abcdef" * 2, b"a passphrase of 32 characters!!!"):
        with pytest.raises(UsageError, match="key (must be|is 32 characters of text)"):
            open_store(tmp_path / "never", key=bad_key)  # type: ignore[arg-type]
    assert not (tmp_path / "never").exists()


def test_one_process_opens_a_store_with_one_key(tmp_path: pathlib.Path) -> None:
    """A store already open in this process is not handed out under another key (or none)."""
    key = os.urandom(32)
    with open_store(tmp_path / "s", key=key) as s:
        with open_store(tmp_path / "s", key=key) as again:
            assert again.encrypted
        with pytest.raises(StoreError, match="already open in this process with another key"):
            open_store(tmp_path / "s", key=os.urandom(32))
        with pytest.raises(StoreError, match="already open in this process with another key"):
            open_store(tmp_path / "s")
        assert s.encrypted


def test_without_the_library_one_clear_line(tmp_path: pathlib.Path) -> None:
    """Without `cryptography`, a key gets one error line saying what to install, before
    anything is created; plain stores work as before."""
    code = textwrap.dedent(f"""
        import sys
        sys.modules["cryptography"] = None  # as if it were not installed
        from tcc.store import open_store
        with open_store({str(tmp_path / 'plain')!r}) as s:
            s.create_run("e", run_id="r")
        try:
            open_store({str(tmp_path / 'enc')!r}, key=bytes(32))
        except Exception as exc:
            print(type(exc).__name__, exc)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ("StoreError encryption at rest needs the 'cryptography' package, "
                                  "which is not installed: pip install 'tcc[encryption]'")
    assert not (tmp_path / "enc").exists()


# ------------------------------------------------------------------ dedup within a lineage


def _chunk_bytes(store: pathlib.Path) -> tuple[int, int]:
    """(number of stored chunks and group nodes, their stored bytes), read raw."""
    env = lmdb.open(str(store), max_dbs=16, readonly=True, lock=False)
    try:
        with env.begin(db=env.open_db(b"chunks", create=False)) as txn:
            values = [len(v) for k, v in txn.cursor() if bytes(k).endswith(b"d")]
    finally:
        env.close()
    return len(values), sum(values)


def _grow(store: pathlib.Path, key: bytes | None, steps: int) -> list[int]:
    """A transcript growing by ~1 KiB per step, one checkpoint per step, every snapshot
    kept; returns the stored chunk bytes after step 10 and after the last step."""
    rng = random.Random(7)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(2 + i % 7))
             for i in range(2000)]
    state = bytearray(b"".join(rng.choice(words).encode() + b" " for _ in range(3000)))
    grown = []
    for first, stop in ((0, 10), (10, steps)):  # (the store must be closed to be read raw)
        with open_store(store, key=key, keep=10_000) as s:
            run = s.create_run("e", run_id="r") if first == 0 else s.get_run("r")
            for i in range(first, stop):
                state[:16] = f"step {i:011d}".encode()  # the head changes too
                state += b"".join(rng.choice(words).encode() + b" " for _ in range(180))
                seq = s.append_intent("r", run.epoch, "llm", b"prompt %d" % i)
                s.checkpoint("r", run.epoch, bytes(state),
                             completion=Completion(seq, result=b"result %d" % i))
            assert s.load_snapshot("r", 1)[:16] == b"step 00000000000"
            assert s.load_snapshot("r") == bytes(state)
        grown.append(_chunk_bytes(store)[1])
    return grown


def test_dedup_works_the_same_in_an_encrypted_store(tmp_path: pathlib.Path) -> None:
    """Deduplication is decided on chunk addresses, not on stored bytes: an encrypted store
    stores the same chunks once each, so its bytes per step stay within a few percent of a
    plain store's (40 bytes of nonce and tag per chunk) and far below the state's size."""
    steps = 60
    plain = _grow(tmp_path / "plain", None, steps)
    encrypted = _grow(tmp_path / "enc", os.urandom(32), steps)
    n_plain, _ = _chunk_bytes(tmp_path / "plain")
    n_enc, _ = _chunk_bytes(tmp_path / "enc")
    per_step_plain = (plain[1] - plain[0]) / (steps - 10)
    per_step_enc = (encrypted[1] - encrypted[0]) / (steps - 10)
    # the same chunks (cuts do not depend on the key; group nodes may cut a little differently)
    assert 0.8 < n_enc / n_plain < 1.25, (n_plain, n_enc)
    assert per_step_enc < 1.3 * per_step_plain, (per_step_plain, per_step_enc)
    # and O(delta): a step stores a few KiB, not the ~20-80 KiB state
    state_size = 3000 * 6 + steps * 180 * 6
    assert per_step_enc < state_size / 8, (per_step_enc, state_size)


# ------------------------------------------------------------------ damage and forgery


def _raw(store: pathlib.Path, db: str) -> dict[bytes, bytes]:
    env = lmdb.open(str(store), max_dbs=16, readonly=True, lock=False)
    try:
        with env.begin(db=env.open_db(db.encode(), create=False)) as txn:
            return {bytes(k): bytes(v) for k, v in txn.cursor()}
    finally:
        env.close()


def _put(store: pathlib.Path, db: str, items: dict[bytes, bytes]) -> None:
    env = lmdb.open(str(store), max_dbs=16)
    try:
        with env.begin(write=True, db=env.open_db(db.encode(), create=False)) as txn:
            for k, v in items.items():
                txn.put(k, v)
    finally:
        env.close()


def _make(store: pathlib.Path, key: bytes) -> None:
    with open_store(store, key=key) as s:
        run = s.create_run("e", run_id="r")
        for n in range(2):  # two chunked snapshots: the newest can fall back to the first
            seq = s.append_intent("r", run.epoch, "llm", b"prompt %d" % n)
            s.checkpoint("r", run.epoch, bytes(range(256)) * 200 + b"%d" % n,
                         completion=Completion(seq, result=b"r%d" % n))


@pytest.mark.parametrize("where", ["chunk", "snapshot record", "journal record", "run record"])
def test_a_flipped_byte_is_detected_before_anything_is_returned(tmp_path: pathlib.Path,
                                                                 where: str) -> None:
    """Every byte of an encrypted value matters: a flip in a chunk's ciphertext, a snapshot
    manifest, a journal or a run record is StoreCorruptError (a snapshot falls back to the
    previous good one), never bytes handed to the unpickler."""
    store, key = tmp_path / "s", os.urandom(32)
    _make(store, key)
    with open_store(store, key=key) as s:
        newest = s.load_snapshot("r")
    db = {"chunk": "chunks", "snapshot record": "snaps", "journal record": "journal",
          "run record": "runs"}[where]
    items = _raw(store, db)
    if where == "chunk":  # one that only the newest snapshot holds: its last chunk
        k = max(k for k in items if k.endswith(b"d"))
    elif where == "snapshot record":
        k = max(k for k in items if len(k) == len(b"default\x00r\x00") + 8)
    elif where == "journal record":
        k = max(k for k in items if not k.endswith(b"\xff" * 10))
    else:
        k = b"default\x00r"
    value = bytearray(items[k])
    value[len(value) // 2] ^= 0x20  # inside the ciphertext
    _put(store, db, {k: bytes(value)})
    with open_store(store, key=key) as s:
        if where in ("chunk", "snapshot record"):
            with pytest.raises(StoreCorruptError, match="snapshot 2 failed verification"):
                s.load_snapshot("r")
            info, data = s.latest_good_snapshot("r")  # type: ignore[misc]
            assert info.number == 1 and data != newest and data.endswith(b"0")
        elif where == "journal record":
            with pytest.raises(StoreCorruptError, match="journal record 3 .*failed verification"):
                s.journal("r")
        else:
            with pytest.raises(StoreCorruptError, match="run 'r' record failed verification"):
                s.get_run("r")


def test_the_secret_file_alone_cannot_forge_or_plant_records(tmp_path: pathlib.Path) -> None:
    """Whoever holds a copy of the store's secret file (it is in every backup) can compute
    the outer MACs, but not the data key: a record whose ciphertext was changed and
    re-MAC'd, a plain record planted with a valid MAC, and a record moved to another key
    with its MAC recomputed are all refused."""
    store, key = tmp_path / "s", os.urandom(32)
    _make(store, key)
    secret = (store / "secret").read_bytes()
    attacker = Sealer(secret)  # the secret, no data key
    journal = _raw(store, "journal")
    k0, k1 = sorted(k for k in journal if not k.endswith(b"\xff" * 10))[:2]
    body = bytearray(journal[k1][16:])
    body[-20] ^= 1
    forged = attacker.mac(b"journal", k1, bytes(body)) + bytes(body)
    assert attacker.verifies(b"journal", k1, forged)
    planted = attacker.seal(b"journal", k1, {"k": "c", "t": 0.0, "i": 0, "d": 0.0}, {"r": b"evil"})
    moved = attacker.mac(b"journal", k1, journal[k0][16:]) + journal[k0][16:]
    for value, why in ((forged, "does not decrypt"), (planted, "is not encrypted"),
                       (moved, "does not decrypt")):
        _put(store, "journal", {k1: value})
        with open_store(store, key=key) as s, pytest.raises(StoreCorruptError, match=why):
            s.journal("r")
    _put(store, "journal", {k1: journal[k1]})
    with open_store(store, key=key) as s:
        assert [r.kind for r in s.journal("r")] == ["intent", "completion"] * 2


def test_a_damaged_data_key_entry_is_refused(tmp_path: pathlib.Path) -> None:
    """The wrapped data key in the format header is authenticated: damage to it is refused
    at open (and told apart from a wrong key by the key id)."""
    store, key = tmp_path / "s", os.urandom(32)
    _make(store, key)
    meta = _raw(store, "meta")
    hdr = json.loads(meta[b"format"])
    assert hdr["version"] == "4-encrypted" and set(hdr["enc"]) == {"alg", "key_id", "salt", "data_key"}
    wrapped = bytearray(bytes.fromhex(hdr["enc"]["data_key"]))
    wrapped[5] ^= 1
    _put(store, "meta", {b"format": json.dumps({**hdr, "enc": {**hdr["enc"],
                                                          "data_key": wrapped.hex()}}).encode()})
    with pytest.raises(StoreCorruptError, match="does not unwrap"):
        open_store(store, key=key)
    _put(store, "meta", {b"format": json.dumps({**hdr, "version": 4}).encode()})
    with pytest.raises(StoreCorruptError, match="says version 4 but the store was written as "
                                                "version 4-encrypted"):
        open_store(store)
    _put(store, "meta", {b"format": meta[b"format"]})
    with open_store(store, key=key) as s:
        assert len(s.snapshots("r")) == 2


def test_housekeeping_and_forks_on_an_encrypted_store(tmp_path: pathlib.Path) -> None:
    """Retention, gc, compaction, forks (which re-seal the journal under the fork's keys),
    signals and events all work on an encrypted store."""
    store, key = tmp_path / "s", os.urandom(32)
    with open_store(store, key=key, keep=2) as s:
        run = s.create_run("e", run_id="r")
        for n in range(5):
            seq = s.append_intent("r", run.epoch, "llm", b"p%d" % n)
            s.checkpoint("r", run.epoch, os.urandom(20_000) + b"%d" % n,
                         completion=Completion(seq, result=b"r%d" % n))
        assert [i.number for i in s.snapshots("r")] == [4, 5]
        fork = s.fork_run("r", 4, new_run_id="f")
        assert [j.args or j.result for j in s.journal("f")] == [
            b"p0", b"r0", b"p1", b"r1", b"p2", b"r2", b"p3", b"r3"]
        assert s.load_snapshot("f").endswith(b"3")
        assert s.send_signal("f", "go", b"yes") and s.take_signal("f", fork.epoch, "go") == b"yes"
        s.add_event("r", "note", {"secret": "in an event"})
        assert s.events("r")[-1].data == {"secret": "in an event"}
        s.delete_run("f")
        s.gc()
        s.compact()
        assert s.load_snapshot("r").endswith(b"4")
    assert b"in an event" not in (store / "data.mdb").read_bytes()


def test_nonces_never_repeat_across_threads_and_forks() -> None:
    """Each message is sealed under its process's session key with a counter nonce; a forked
    child starts a session of its own instead of reusing the parent's counter."""
    from concurrent.futures import ThreadPoolExecutor

    from tcc.store._crypt import Crypt

    crypt = Crypt(os.urandom(32))
    with ThreadPoolExecutor(8) as pool:
        sealed = list(pool.map(lambda i: crypt.encrypt(b"ad", b"x%d" % i), range(2000)))
    nonces = {m[:24] for m in sealed}
    assert len(nonces) == 2000 and len({m[:16] for m in sealed}) == 1
    assert all(crypt.decrypt(b"ad", m) == b"x%d" % i for i, m in enumerate(sealed))
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.write(write, crypt.encrypt(b"ad", b"child")[:24])
        finally:
            os._exit(0)
    os.close(write)
    child = os.read(read, 24)
    os.close(read)
    os.waitpid(pid, 0)
    assert len(child) == 24 and child[:16] != sealed[0][:16]
    assert crypt.encrypt(b"ad", b"parent")[:24] not in nonces | {child}


# ------------------------------------------------------------------ tcc.env


class _Client:
    def __init__(self, api_key: str, extra: Any = None) -> None:
        self.api_key = api_key
        self.extra = extra


def test_env_placeholders_are_captured_by_name_and_resolved_at_build(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """tcc.env pickles as the variable's name; a resource factory gets the value (also in
    nested lists and dicts), read again after a restore; the repr never shows it."""
    monkeypatch.setenv("TCC_TEST_SECRET_KEY", "sk-live-value-1")
    placeholder = tcc.env("TCC_TEST_SECRET_KEY")
    assert repr(placeholder) == "tcc.env('TCC_TEST_SECRET_KEY')"
    assert b"sk-live" not in pickle.dumps(placeholder)
    client = tcc.resource(_Client, api_key=placeholder,
                          extra={"headers": [placeholder, ("x", placeholder)], "n": 1})
    assert client.api_key == "sk-live-value-1"
    assert client.extra == {"headers": ["sk-live-value-1", ("x", "sk-live-value-1")], "n": 1}
    blob = tcc.dumps(client)
    from tcc.capture import dump_payload

    raw = dump_payload(client)
    assert b"sk-live" not in raw and b"TCC_TEST_SECRET_KEY" in raw
    monkeypatch.setenv("TCC_TEST_SECRET_KEY", "sk-live-value-2")  # rotated before the restore
    assert tcc.loads(blob).api_key == "sk-live-value-2"
    monkeypatch.delenv("TCC_TEST_SECRET_KEY")
    with pytest.raises(UsageError, match="environment variable TCC_TEST_SECRET_KEY is not set, "
                                         r"and tcc.resource\(_Client\) needs it"):
        tcc.loads(blob).api_key
    assert "sk-live" not in repr(client)
    for bad in ("", "A=B", 3):
        with pytest.raises(UsageError):
            tcc.env(bad)  # type: ignore[arg-type]
    assert tcc.env("A") == tcc.env("A") and hash(tcc.env("A")) == hash(tcc.env("A"))
    with pytest.raises(AttributeError):
        placeholder.name = "OTHER"  # type: ignore[misc]


def test_the_cipher_is_the_public_aesgcm_of_cryptography() -> None:
    """``_aesgcm`` takes AESGCM from cryptography's compiled module (its public ``aead``
    module imports the whole ciphers layer first, ~15 ms of every fresh ``tcc resume``): it
    must be the very class cryptography documents, not another one of the same name."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    from tcc.store._crypt import _aesgcm

    assert _aesgcm() is AESGCM


def test_taking_the_cipher_leaves_cryptographys_ciphers_layer_unimported() -> None:
    """What ``_aesgcm`` is for: a fresh process that seals with AES-GCM does not import
    cryptography's public ciphers layer (where cryptography has its class compiled)."""
    import subprocess
    import sys

    from cryptography.hazmat.bindings._rust import openssl as rust_openssl

    if not hasattr(rust_openssl, "aead"):
        pytest.skip("this cryptography has no compiled AESGCM: the public module is the path")
    code = ("import sys; from tcc.store._crypt import _aesgcm; _aesgcm(); "
            "print('cryptography.hazmat.primitives.ciphers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         check=True).stdout.strip()
    assert out == "False"
