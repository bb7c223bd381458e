"""An agent whose state holds what goes out of band in a snapshot: a long transcript
(list segments), an unchanged 1 MiB ``bytes`` referenced twice, a ``bytearray`` that
changes at every step, and a small bytes value that stays in the pickle.

``KILL_AT=i`` SIGKILLs the process inside step ``i``'s effect (after the snapshot of
step ``i - 1`` was committed)."""

from __future__ import annotations

import hashlib
import os
import signal

import tcc


@tcc.effect
def reply(i: int) -> str:
    if os.environ.get("KILL_AT") == str(i):
        os.kill(os.getpid(), signal.SIGKILL)
    return f"reply {i}"


async def main(n: str = "700") -> dict[str, object]:
    blob = hashlib.sha256(b"seed").digest() * (1 << 15)  # 1 MiB, never changed
    held = [blob, blob]  # three references to one object
    buf = bytearray(256 << 10)  # changed in place at every step
    small = b"small" * 10
    transcript: list[dict[str, object]] = []
    for i in range(int(n)):
        out = await reply(i)
        transcript.append({"role": "assistant", "content": out, "i": i})
        buf[i * 97 % len(buf)] = i % 251
        if i % 200 == 199:
            buf.extend(b"+" * 1000)  # and grows
    digest = hashlib.sha256()
    for part in (blob, bytes(buf), small, repr(transcript).encode()):
        digest.update(part)
    return {
        "n": len(transcript),
        "digest": digest.hexdigest()[:16],
        "types": [type(blob).__name__, type(buf).__name__, type(small).__name__],
        "shared": held[0] is blob and held[1] is blob,
        "buf_len": len(buf),
    }
