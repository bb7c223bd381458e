"""Ledger effects, one of which cuts its own process's connections to the PostgreSQL store.

Environment: LEDGER (path, required), STEPS (default 6), CUT_AT (the step whose
effect cuts, default 2), CUT_MARKER (a file: the cut happens only while it does
not exist, and the effect creates it, so a resume does not cut again), VERIFY=1 to
give the effect a verify probe that finds its own ledger line, TCC_STORE (the
store's URL: the cut connects there on its own).

The cutting effect appends its ledger line like the others (``KEY VALUE``, the
value made from a random salt, so a re-issue with other arguments would show),
then, from a separate connection, terminates every backend of the store's
database whose ``application_name`` is ``tcc`` -- the connections of the tcc
process running this effect -- so the commit of its completion finds its
connection gone.  The line ``cut N`` is appended to CUT_MARKER for each backend
terminated.
"""

import os
import random

import tcc

LEDGER = os.environ["LEDGER"]
CUT_AT = int(os.environ.get("CUT_AT", "2"))
MARKER = os.environ.get("CUT_MARKER", LEDGER + ".cut")

TERMINATE = ("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE "
             "application_name = 'tcc' AND datname = current_database() AND pid <> pg_backend_pid()")


def _cut() -> int:
    import psycopg

    with psycopg.connect(os.environ["TCC_STORE"], autocommit=True, application_name="pg_cut_agent") as conn:
        return int(conn.execute(TERMINATE).fetchone()[0])


def probe(intent):
    """Exactly-once: if this call's line is already in the ledger, reuse its value."""
    try:
        with open(LEDGER) as fh:
            lines = fh.read().splitlines()
    except FileNotFoundError:
        return None
    for line in lines:
        key, _, value = line.partition(" ")
        if key == intent.idempotency_key:
            return int(value)
    return None


def _append(step, salt):
    value = step * 1000 + salt
    with open(LEDGER, "a") as fh:
        fh.write(f"{tcc.current().idempotency_key} {value}\n")
    if step == CUT_AT and not os.path.exists(MARKER):
        with open(MARKER, "w") as fh:
            fh.write(f"cut {_cut()}\n")
    return value


append = tcc.effect(_append, name="pg_cut:append")
append_verified = tcc.effect(_append, name="pg_cut:append_verified", verify=probe)


async def main(steps=None):
    steps = int(steps or os.environ.get("STEPS", "6"))
    effect = append_verified if os.environ.get("VERIFY") == "1" else append
    total = 0
    for step in range(steps):
        value = await effect(step, random.randrange(1000))
        assert value // 1000 == step
        total += value // 1000
    return {"steps": steps, "total": total}
