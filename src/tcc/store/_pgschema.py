"""The PostgreSQL store's schema, its version and its migrations.

Everything lives in the PostgreSQL schema ``tcc``.  ``tcc.meta`` holds the
schema version and the key check; :data:`MIGRATIONS` lists, in order, the SQL
that takes a database from version ``n - 1`` to ``n``.  Migrations run in one
transaction under an advisory lock (:data:`MIGRATE_LOCK`), so many workers
starting together migrate once; a database whose version is newer than
:data:`SCHEMA_VERSION` is refused ("upgrade tcc").

What the database itself enforces, whatever the client does:

* ``journal_answered_once``: an intent has at most one completion (a unique
  index on the completion's ``intent_seq``);
* ``signals`` primary key: a signal name is delivered to a run once, ever;
* ``signal_consumptions`` primary key: a signal is consumed once, ever;
* the epoch fence: every owner's write starts with ``UPDATE tcc.runs ... WHERE
  epoch = $epoch AND status NOT IN ('completed', 'cancelled')``, which takes
  the run row's lock, so a concurrent claim (``epoch = epoch + 1``) waits for
  it or fences it; a fenced function raises before it writes anything;
* leases are ``timestamptz`` computed with the server's ``now()``.

The sealed ``record`` column of each row is what readers trust (its MAC is
keyed by a secret the database does not hold); the other columns exist so
that the database can look rows up, order them and enforce the rules above.

Errors the functions raise carry SQLSTATEs of class ``TC``, mapped back to
tcc's exceptions by ``_postgres``:

=======  ===================================================================
TC001    fenced: no run row with this epoch and a status that is not final
TC002    moved: the caller's expected journal or snapshot number is stale
TC004    the completion names no intent of this run
TC005    the signal to consume is not pending
TC006    the snapshot the caller's chunk list relies on is gone
=======  ===================================================================
"""

from __future__ import annotations

__all__ = ["CHUNK_LOCK", "MIGRATE_LOCK", "MIGRATIONS", "SCHEMA", "SCHEMA_VERSION", "WORK_CHANNEL"]

SCHEMA = "tcc"
#: The advisory lock key (a bigint) migrations hold.
MIGRATE_LOCK = 0x7463635F6D696772  # "tcc_migr"
#: The advisory lock key checkpoints hold shared and gc exclusive: a chunk gc
#: found unreferenced cannot be adopted by a checkpoint committing meanwhile.
CHUNK_LOCK = 0x7463635F63686B73  # "tcc_chks"

_V1 = f"""
CREATE SCHEMA IF NOT EXISTS tcc;
CREATE TABLE tcc.meta (key text PRIMARY KEY, value text NOT NULL);
CREATE TABLE tcc.runs (
    tenant text NOT NULL,
    run_id text NOT NULL,
    status text NOT NULL,
    epoch bigint NOT NULL,
    owner_host text NOT NULL,
    owner_pid integer NOT NULL,
    lease_expiry timestamptz NOT NULL,
    created timestamptz NOT NULL DEFAULT now(),
    updated timestamptz NOT NULL DEFAULT now(),
    keep integer,
    journal_len bigint NOT NULL DEFAULT 0,
    snapshots_made bigint NOT NULL DEFAULT 0,
    record bytea NOT NULL,
    PRIMARY KEY (tenant, run_id)
);
CREATE INDEX runs_by_status ON tcc.runs (tenant, status);
CREATE TABLE tcc.journal (
    tenant text NOT NULL,
    run_id text NOT NULL,
    seq bigint NOT NULL,
    kind text NOT NULL CHECK (kind IN ('intent', 'completion')),
    intent_seq bigint,
    record bytea NOT NULL,
    PRIMARY KEY (tenant, run_id, seq),
    CHECK ((kind = 'completion') = (intent_seq IS NOT NULL))
);
CREATE UNIQUE INDEX journal_answered_once ON tcc.journal (tenant, run_id, intent_seq)
    WHERE intent_seq IS NOT NULL;
CREATE TABLE tcc.snapshots (
    tenant text NOT NULL,
    run_id text NOT NULL,
    number bigint NOT NULL,
    journal_len bigint NOT NULL,
    size bigint NOT NULL,
    created timestamptz NOT NULL DEFAULT now(),
    record bytea NOT NULL,
    PRIMARY KEY (tenant, run_id, number)
);
CREATE TABLE tcc.chunks (address bytea PRIMARY KEY, data bytea NOT NULL);
CREATE TABLE tcc.pins (
    tenant text NOT NULL,
    run_id text NOT NULL,
    number bigint NOT NULL,
    holder text NOT NULL,
    PRIMARY KEY (tenant, run_id, number, holder)
);
CREATE TABLE tcc.signals (
    tenant text NOT NULL,
    run_id text NOT NULL,
    name text NOT NULL,
    record bytea NOT NULL,
    PRIMARY KEY (tenant, run_id, name)
);
CREATE TABLE tcc.signal_consumptions (
    tenant text NOT NULL,
    run_id text NOT NULL,
    name text NOT NULL,
    consumed timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, run_id, name)
);
CREATE TABLE tcc.events (
    id bigserial PRIMARY KEY,
    tenant text NOT NULL,
    run_id text NOT NULL,
    record bytea NOT NULL
);
CREATE INDEX events_by_run ON tcc.events (tenant, run_id, id);
-- sealed records and chunks are encrypted: compressing them only costs CPU
ALTER TABLE tcc.runs ALTER COLUMN record SET STORAGE EXTERNAL;
ALTER TABLE tcc.journal ALTER COLUMN record SET STORAGE EXTERNAL;
ALTER TABLE tcc.snapshots ALTER COLUMN record SET STORAGE EXTERNAL;
ALTER TABLE tcc.chunks ALTER COLUMN data SET STORAGE EXTERNAL;
ALTER TABLE tcc.signals ALTER COLUMN record SET STORAGE EXTERNAL;
ALTER TABLE tcc.events ALTER COLUMN record SET STORAGE EXTERNAL;

-- Every function below starts with the fence: the conditional UPDATE of the run
-- row locks it (a concurrent claim waits for the commit) and moves its counters;
-- no row means a stale epoch or a final status (TC001), and nothing is written.

-- One effect's intent, at the journal position the caller sealed it for.  Its
-- commit is not waited for (synchronous_commit off for this transaction only):
-- it is visible at once and survives the client's crash; the WAL flush of the
-- step's own commit, which follows it in the log, makes it durable against a
-- crash of the server (or the WAL writer does, within 3 x wal_writer_delay).
CREATE FUNCTION tcc.append_intent(p_tenant text, p_run text, p_epoch bigint, p_seq bigint,
                                  p_record bytea, p_sync boolean) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_len bigint;
BEGIN
    IF NOT p_sync THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    UPDATE tcc.runs r SET journal_len = r.journal_len + 1
     WHERE r.tenant = p_tenant AND r.run_id = p_run AND r.epoch = p_epoch
       AND r.status NOT IN ('completed', 'cancelled')
    RETURNING r.journal_len INTO v_len;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'fenced' USING ERRCODE = 'TC001';
    END IF;
    IF v_len - 1 <> p_seq THEN
        RAISE EXCEPTION 'journal moved: next record is %', v_len - 1 USING ERRCODE = 'TC002';
    END IF;
    INSERT INTO tcc.journal VALUES (p_tenant, p_run, p_seq, 'intent', NULL, p_record);
    RETURN p_seq;
END $$;

-- One step, in one call and one transaction: the fence, the completion (if
-- any), the consumed signal (if any), the snapshot's new chunks and record
-- (if any), and retention (the unpinned snapshots older than the newest p_keep).
-- p_base: the snapshot whose chunks the caller did not send again (NULL: it
-- sent every chunk it references).
CREATE FUNCTION tcc.commit_step(
    p_tenant text, p_run text, p_epoch bigint,
    p_seq bigint, p_intent bigint, p_completion bytea,
    p_signal text,
    p_number bigint, p_record bytea, p_size bigint, p_base bigint,
    p_addresses bytea[], p_chunks bytea[], p_keep integer,
    OUT journal_len bigint, OUT created float8)
LANGUAGE plpgsql AS $$
DECLARE
    v_made bigint;
    v_keep integer;
BEGIN
    IF p_record IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock_shared({CHUNK_LOCK});
    END IF;
    UPDATE tcc.runs r
       SET journal_len = r.journal_len + CASE WHEN p_completion IS NULL THEN 0 ELSE 1 END,
           snapshots_made = r.snapshots_made + CASE WHEN p_record IS NULL THEN 0 ELSE 1 END
     WHERE r.tenant = p_tenant AND r.run_id = p_run AND r.epoch = p_epoch
       AND r.status NOT IN ('completed', 'cancelled')
    RETURNING r.journal_len, r.snapshots_made, r.keep INTO journal_len, v_made, v_keep;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'fenced' USING ERRCODE = 'TC001';
    END IF;
    IF p_completion IS NOT NULL THEN
        IF journal_len - 1 <> p_seq THEN
            RAISE EXCEPTION 'journal moved: next record is %', journal_len - 1 USING ERRCODE = 'TC002';
        END IF;
        -- a second completion of the intent violates journal_answered_once
        INSERT INTO tcc.journal
             SELECT p_tenant, p_run, p_seq, 'completion', p_intent, p_completion
              WHERE EXISTS (SELECT 1 FROM tcc.journal j WHERE j.tenant = p_tenant
                            AND j.run_id = p_run AND j.seq = p_intent AND j.kind = 'intent');
        IF NOT FOUND THEN
            RAISE EXCEPTION 'record % is not an intent', p_intent USING ERRCODE = 'TC004';
        END IF;
    END IF;
    IF p_signal IS NOT NULL THEN
        -- the primary key of signal_consumptions makes a second consumption fail
        INSERT INTO tcc.signal_consumptions (tenant, run_id, name)
             SELECT p_tenant, p_run, p_signal
              WHERE EXISTS (SELECT 1 FROM tcc.signals s WHERE s.tenant = p_tenant
                            AND s.run_id = p_run AND s.name = p_signal)
             ON CONFLICT DO NOTHING;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'signal % is not pending (never delivered, or consumed already)',
                p_signal USING ERRCODE = 'TC005';
        END IF;
    END IF;
    IF p_record IS NOT NULL THEN
        IF v_made <> p_number THEN
            RAISE EXCEPTION 'snapshots moved: next is %', v_made USING ERRCODE = 'TC002';
        END IF;
        IF p_base IS NOT NULL THEN
            PERFORM 1 FROM tcc.snapshots s
              WHERE s.tenant = p_tenant AND s.run_id = p_run AND s.number = p_base;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'snapshot % is gone', p_base USING ERRCODE = 'TC006';
            END IF;
        END IF;
        IF cardinality(p_addresses) > 0 THEN
            INSERT INTO tcc.chunks SELECT * FROM unnest(p_addresses, p_chunks) ON CONFLICT DO NOTHING;
        END IF;
        INSERT INTO tcc.snapshots (tenant, run_id, number, journal_len, size, record)
             VALUES (p_tenant, p_run, p_number, journal_len, p_size, p_record);
        -- every unpinned snapshot past the newest keep, as LMDB's retention: also one a
        -- fork no longer pins, or one a smaller keep drops (an index range of a few rows)
        DELETE FROM tcc.snapshots s
         WHERE s.tenant = p_tenant AND s.run_id = p_run
           AND s.number <= p_number - coalesce(v_keep, p_keep)
           AND NOT EXISTS (SELECT 1 FROM tcc.pins p WHERE p.tenant = s.tenant
                           AND p.run_id = s.run_id AND p.number = s.number);
    END IF;
    created := extract(epoch FROM now());
END $$;
"""

# Version 2: module sources for ``tcc resume --code pinned`` (``Store.put_code``), one
# row per tenant and SHA-256 digest; never deleted by gc (small, shared by every run).
_V2 = """
CREATE TABLE tcc.code (
    tenant text NOT NULL,
    digest bytea NOT NULL,
    record bytea NOT NULL,
    PRIMARY KEY (tenant, digest)
);
"""

# Version 3: the fleet.  ``wake`` says when a worker should look at a run that is not
# running (a submission: now; a sleep: its end; a signal or a finished child: now); a
# running run is due when its lease expires.  ``spawned_by``: the run a ``tcc.spawn``
# child wakes when it finishes.  The indexes are what a worker's claim query reads.
# Runs parked before this version are made due once: the worker checks each and clears
# what is not due yet; the children runs spawned before it get their ``spawned_by``.
_V3 = """
ALTER TABLE tcc.runs ADD COLUMN wake timestamptz;
ALTER TABLE tcc.runs ADD COLUMN spawned_by text;
CREATE INDEX runs_wake ON tcc.runs (tenant, wake)
    WHERE wake IS NOT NULL AND status IN ('queued', 'waiting', 'sleeping');
CREATE INDEX runs_lease ON tcc.runs (tenant, lease_expiry) WHERE status = 'running';
CREATE INDEX runs_by_host ON tcc.runs (tenant, owner_host)
    WHERE status IN ('queued', 'running', 'waiting', 'sleeping');
UPDATE tcc.runs SET wake = now() WHERE status IN ('waiting', 'sleeping');
-- the children older runs spawned: a child's id is its parent's, a dot and a number
UPDATE tcc.runs c SET spawned_by = p.run_id FROM tcc.runs p
 WHERE c.spawned_by IS NULL AND p.tenant = c.tenant
   AND c.run_id = p.run_id || '.' || substring(c.run_id FROM '[.]([0-9]+)$');
"""

#: The channel of the NOTIFY a work-creating write sends (payload: the tenant).
WORK_CHANNEL = "tcc_work"

#: MIGRATIONS[n - 1] takes a database from schema version n - 1 to n.
MIGRATIONS: tuple[str, ...] = (_V1, _V2, _V3)
SCHEMA_VERSION = len(MIGRATIONS)
