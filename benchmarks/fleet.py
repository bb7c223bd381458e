"""A fleet on ONE PostgreSQL server: tcc workers and DBOS queues side by side.

    python -m benchmarks.fleet --smoke    # about a minute and a half: a CI smoke test
    python -m benchmarks.fleet --quick    # a few minutes
    ... --dsn postgresql://USER@HOST:PORT/postgres   # an existing server instead of a temporary one

Without ``--dsn`` a throw-away cluster is started (``tcc.testing.postgres.TemporaryServer``,
fsync on, with ``shared_preload_libraries=pg_stat_statements`` when the server has it); every
measurement gets a database of its own on it.  Measured, in one run:

1. **Takeover of a dead host's run, as a function of the lease.**  A ``tcc run --lease L``
   of ``peers/fleet_agent.py`` (an effect every 50 ms, each appending a timestamped line with
   its pid to a log) runs as host ``hostA`` (``$TCC_HOST_ID``).  Once it is under way a
   ``tcc worker --lease L`` of host ``hostB`` is started; when it idles (its first poll saw
   the run, and it sleeps until that run's lease ends) the run's process group is SIGKILLed,
   ``kill_after`` s later.  Takeover = kill -> the first effect written by another process;
   split into kill -> the worker's claim (its ``taken_over`` event) and claim -> first effect
   (``tcc resume`` spawned, store opened, continuation restored).  The expected floor is the
   lease left at the kill: ``lease_expiry`` (read from ``tcc.runs`` after the kill) - kill
   time = L - time since the last renewal (the heartbeat renews every L/3).  The quick
   profile adds a worker of the *same* host (it holds a pidfd of the owner and takes the run
   when the owner exits: the lease floor does not apply) and ``early-kill``: the worker is
   up before the run starts and the kill comes 1 s after the run's start, before the
   worker's next poll (every 5 s); the new run's NOTIFY told it the run's lease.
2. **Fleet throughput**: a batch of runs of the same agent (``steps`` effects, no delay)
   with 1, 2 and 4 ``tcc worker --concurrency C`` processes (each its own ``$TCC_HOST_ID``),
   next to 1, 2 and 4 DBOS processes (``peers/fleet_child_dbos.py``: ``DBOS.launch()``, a
   queue with ``worker_concurrency=C``, DBOS's defaults otherwise, the same steps as a
   ``@DBOS.workflow`` of ``@DBOS.step``s).  Runs are submitted from this process (tcc:
   ``tcc.runtime.submit``, what ``tcc submit`` calls, without a process per submission;
   DBOS: ``DBOSClient.enqueue``) once every worker is up; throughput = runs / (first
   submission -> last completion, the ``updated`` time of the last finished row).  tcc starts
   a ``tcc resume`` *process* per run (interpreter, imports, store connection); DBOS runs a
   workflow in a *thread* of a process that is already up, but finds queued work only by its
   queue poll (1 s by default), taking at most ``worker_concurrency`` per process per poll.
3. **Database load of an idle fleet**: 4 idle ``tcc worker`` processes, then 4 idle DBOS
   processes, each on a database of its own, over ``idle_s`` seconds: statements per second
   from ``pg_stat_statements`` (top-level statements, utility statements such as BEGIN and
   COMMIT included) when the server has it, and transactions per second from
   ``pg_stat_database`` (``xact_commit + xact_rollback``; backends report these at most
   every second, idle ones up to 10 s late, so the window's edges blur them), and the
   connections each fleet holds.

Writes raw JSON and the markdown table to ``benchmarks/results/fleet-PROFILE-TIME.{json,md}``.
Nothing about speed is asserted: the exit status says only whether every system produced
numbers and every run its exact result.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any, Iterator

from benchmarks import provenance

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
AGENT = str(ROOT / "benchmarks" / "peers" / "fleet_agent.py")
DBOS_CHILD = str(ROOT / "benchmarks" / "peers" / "fleet_child_dbos.py")

PROFILES: dict[str, dict[str, Any]] = {
    "smoke": {"leases": [1.0, 2.0], "takeover_repeats": 1, "same_host_leases": [], "early_kill_leases": [],
              "kill_after": 1.0, "runs": 20, "steps": 5, "workers": [1, 2, 4], "concurrency": 2,
              "idle_workers": 4, "idle_s": 5.0},
    "quick": {"leases": [1.0, 2.0, 5.0], "takeover_repeats": 3, "same_host_leases": [5.0],
              "early_kill_leases": [1.0], "kill_after": 1.0, "runs": 100, "steps": 5,
              "workers": [1, 2, 4], "concurrency": 2, "idle_workers": 4, "idle_s": 20.0},
}
STEP_DELAY = 0.05  # seconds between the takeover agent's effects
TCC_FINISHED = ("completed", "unverified", "failed", "cancelled")


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def spread(xs: list[float]) -> float:
    return (max(xs) - min(xs)) / 2 if xs else float("nan")


def quantile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    ys = sorted(xs)
    return ys[min(len(ys) - 1, int(q * len(ys)))]


# ---------------------------------------------------------------- processes


class Procs:
    """Every process this harness starts, each in a session (process group) of its own, so
    that stopping one stops what it started too (a worker's ``tcc resume`` children)."""

    def __init__(self) -> None:
        self.live: list[subprocess.Popen[bytes]] = []

    def start(self, cmd: list[str], env: dict[str, str], log: pathlib.Path) -> subprocess.Popen[bytes]:
        with open(log, "ab") as out:
            proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                    start_new_session=True)
        self.live.append(proc)
        return proc

    @staticmethod
    def kill_group(proc: subprocess.Popen[bytes]) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # killed children of the group may linger a moment
            try:
                os.killpg(proc.pid, 0)
            except (ProcessLookupError, PermissionError):
                return
            time.sleep(0.02)

    def stop(self, proc: subprocess.Popen[bytes], grace: float = 10.0) -> None:
        """SIGTERM (a worker stops starting runs and waits for its children), then SIGKILL
        of the whole group."""
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=grace)
        self.kill_group(proc)
        if proc in self.live:
            self.live.remove(proc)

    def stop_all(self, grace: float = 10.0) -> None:
        for proc in list(self.live):
            self.stop(proc, grace)

    def kill_all(self) -> None:
        for proc in list(self.live):
            self.kill_group(proc)
        self.live.clear()


def tail(path: pathlib.Path, n: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


def tcc_env(url: str, key: str, host: str) -> dict[str, str]:
    from benchmarks.recovery import env_for

    return env_for(url, TCC_STORE_KEY_FILE=key, TCC_HOST_ID=host)  # type: ignore[arg-type]


def tcc_init(srv: Any, db: str, work: pathlib.Path) -> tuple[str, str]:
    from benchmarks.recovery import tcc_cmd

    url = srv.create(db)
    key = work / f"{db}.key"
    key.unlink(missing_ok=True)
    proc = subprocess.run(tcc_cmd("init", "--store", url, "--key-file", str(key)),
                          env=tcc_env(url, str(key), "bench-init"), capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"`tcc init --store {url}` failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return url, str(key)


def wait_for(what: str, cond: Any, timeout: float, logs: list[pathlib.Path] = ()) -> Any:  # type: ignore[assignment]
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            text = "\n".join(f"--- {p.name}\n{tail(p)}" for p in logs)
            raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}\n{text}")
        time.sleep(0.02)


def listeners(srv: Any, db: str) -> int:
    with srv._admin() as conn:
        return int(conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND "
                                "application_name = 'tcc-listen'", (db,)).fetchone()[0])


def start_tcc_workers(procs: Procs, srv: Any, db: str, url: str, key: str, work: pathlib.Path, hosts: list[str],
                      args: list[str]) -> tuple[list[subprocess.Popen[bytes]], list[pathlib.Path]]:
    """``tcc worker ARGS`` per host; returns once each is listening (its LISTEN connection
    is up: it has polled once and idles)."""
    from benchmarks.recovery import tcc_cmd

    workers, logs = [], []
    for host in hosts:
        log = work / f"{db}-{host}.log"
        logs.append(log)
        workers.append(procs.start(tcc_cmd("worker", *args), tcc_env(url, key, host), log))
    wait_for(f"{len(hosts)} tcc workers listening", lambda: listeners(srv, db) >= len(hosts), 60, logs)
    return workers, logs


def read_log(path: pathlib.Path) -> list[tuple[str, int, float, int]]:
    """The agent's effect log: (tag, step, time, pid) per execution."""
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 4:
                out.append((parts[0], int(parts[1]), float(parts[2]), int(parts[3])))
    return out


# ---------------------------------------------------------------- 1. takeover


def takeover_round(procs: Procs, srv: Any, work: pathlib.Path, *, lease: float, worker_host: str,
                   kill_after: float, worker_first: bool, label: str, r: int) -> dict[str, Any]:
    """One kill of a ``tcc run`` of host hostA and its takeover by a worker of ``worker_host``."""
    from benchmarks.recovery import tcc_cmd
    from tcc.store import open_store

    db = f"takeover_{label}_{str(lease).replace('.', '_')}_r{r}"
    url, key = tcc_init(srv, db, work)
    log = work / f"{db}.effects"
    log.unlink(missing_ok=True)
    run_log = work / f"{db}-run.log"
    wargs = ["--concurrency", "2", "--lease", f"{lease:g}"]
    workers: list[subprocess.Popen[bytes]] = []
    wlogs: list[pathlib.Path] = []
    if worker_first:  # idle since before the run: the run's creation notifies it
        workers, wlogs = start_tcc_workers(procs, srv, db, url, key, work, [worker_host], wargs)
    owner = procs.start(tcc_cmd("run", "--lease", f"{lease:g}", "--run-id", "takeover", AGENT, str(log), "t",
                                "100000", str(STEP_DELAY)), tcc_env(url, key, "hostA"), run_log)
    try:
        t_start = time.time()
        wait_for("the run's first effect", lambda: read_log(log), 60, [run_log])
        if not worker_first:  # its first poll sees the run, and it then sleeps until the lease ends
            workers, wlogs = start_tcc_workers(procs, srv, db, url, key, work, [worker_host], wargs)
            time.sleep(0.5)  # listening comes just before its first poll
            t_start = time.time()
        time.sleep(max(0.0, t_start + kill_after - time.time()))
        os.killpg(owner.pid, signal.SIGKILL)
        t_kill = time.time()
        procs.kill_group(owner)
        procs.live.remove(owner)
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            expiry, epoch = conn.execute("SELECT extract(epoch FROM lease_expiry)::float8, epoch FROM tcc.runs "  # type: ignore[misc]
                                         "WHERE run_id = 'takeover'").fetchone()
        old = [e for e in read_log(log) if e[3] == owner.pid]
        if not old:
            raise RuntimeError("the killed run wrote no effect")

        def new_effect() -> Any:
            return [e for e in read_log(log) if e[3] != owner.pid]

        new = wait_for("the first effect of the resumed run", new_effect, lease + 30, [run_log, *wlogs])
        first = min(new, key=lambda e: e[2])
        with open_store(url, create=False, key_file=key) as st:
            raw_events = st.events("takeover")
        claims = [e for e in raw_events if e.kind == "taken_over" and dict(e.data).get("new_epoch") == epoch + 1]
        t_claim = _event_time(claims[0]) if claims else None
        last_old = max(old, key=lambda e: e[2])
        floor = expiry - t_kill
        return {
            "lease_s": lease, "worker_host": worker_host, "kill_after_s": kill_after, "label": label,
            "worker_started_first": worker_first,
            "takeover_s": first[2] - t_kill,
            "kill_to_claim_s": (t_claim - t_kill) if t_claim is not None else None,
            "claim_to_effect_s": (first[2] - t_claim) if t_claim is not None else None,
            "expected_floor_s": floor, "since_last_renewal_s": lease - floor,
            "claim_reason": dict(claims[0].data).get("reason") if claims else None,
            "steps_before_kill": len(old), "last_old_step": last_old[1], "first_new_step": first[1],
            # the step in flight at the kill may run again (no verify probe): in doubt
            "continued_ok": first[1] in (last_old[1], last_old[1] + 1),
            "events": [e.kind for e in raw_events][-6:],
        }
    finally:
        if owner.poll() is None or owner in procs.live:
            procs.kill_group(owner)
            if owner in procs.live:
                procs.live.remove(owner)
        for w in workers:
            procs.stop(w)
        srv.drop(db)


def _event_time(event: Any) -> float | None:
    for name in ("time", "t", "at", "when"):
        value = getattr(event, name, None)
        if isinstance(value, (int, float)):
            return float(value)
    return None


# ---------------------------------------------------------------- 2. throughput


def expected(tag: str, steps: int) -> dict[str, Any]:
    return {"tag": tag, "steps": steps, "total": sum(range(steps))}


def count_effects(log: pathlib.Path, tags: list[str], steps: int) -> dict[str, Any]:
    entries = read_log(log)
    seen: dict[str, list[int]] = {}
    for tag, step, _, _ in entries:
        seen.setdefault(tag, []).append(step)
    missing = sum(1 for t in tags for s in range(steps) if s not in seen.get(t, []))
    return {"executions": len(entries), "duplicates": len(entries) - sum(len(set(v)) for v in seen.values()),
            "missing": missing}


def tcc_throughput(procs: Procs, srv: Any, work: pathlib.Path, *, workers: int, concurrency: int, runs: int,
                   steps: int) -> dict[str, Any]:
    from tcc import runtime
    from tcc.store import open_store

    db = f"tput_tcc_w{workers}"
    url, key = tcc_init(srv, db, work)
    log = work / f"{db}.effects"
    log.unlink(missing_ok=True)
    hosts = [f"fleet-w{i}" for i in range(workers)]
    started, wlogs = start_tcc_workers(procs, srv, db, url, key, work, hosts, ["--concurrency", str(concurrency)])
    tags = [f"r{i:04d}" for i in range(runs)]
    cpu0 = children_cpu()
    try:
        import psycopg

        with open_store(url, create=False, key_file=key) as st, psycopg.connect(url, autocommit=True) as conn:
            t0 = time.time()
            for tag in tags:
                runtime.submit(st, AGENT, [str(log), tag, str(steps), "0"], run_id=tag)
            t_submitted = time.time()

            def done() -> Any:
                n, last = conn.execute(  # type: ignore[misc]
                    "SELECT count(*) FILTER (WHERE status IN %s), extract(epoch FROM max(updated) FILTER "
                    "(WHERE status IN %s))::float8 FROM tcc.runs".replace("%s", "('" + "','".join(TCC_FINISHED) + "')")
                ).fetchone()
                return (n, last) if n >= runs else None

            _, t_last = wait_for(f"{runs} tcc runs to finish", done, 60 + 3.0 * runs, wlogs)
            t_seen = time.time()
            lat = [float(x) for (x,) in conn.execute(
                "SELECT extract(epoch FROM updated - created)::float8 FROM tcc.runs").fetchall()]
            wrong = []
            for run in st.list_runs():
                got = runtime.decode_result(run.result)
                if run.status != "completed" or got != expected(run.run_id, steps):
                    wrong.append(f"{run.run_id}: {run.status} {got!r}")
    finally:
        for w in started:
            procs.stop(w)
    effects = count_effects(log, tags, steps)
    effects["fleet_cpu_s"] = children_cpu() - cpu0
    srv.drop(db)
    return _throughput_row("tcc", workers, concurrency, runs, steps, t0, t_submitted, t_last, t_seen, lat, wrong,
                           effects)


def children_cpu() -> float:
    """CPU seconds (user + system) of this process's waited-for descendants: the workers, and
    the ``tcc resume`` processes a worker waited for, once the worker is stopped."""
    import resource

    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _throughput_row(system: str, workers: int, concurrency: int, runs: int, steps: int, t0: float,
                    t_submitted: float, t_last: float, t_seen: float, lat: list[float], wrong: list[str],
                    effects: dict[str, int]) -> dict[str, Any]:
    elapsed = t_last - t0
    return {"system": system, "workers": workers, "concurrency": concurrency, "runs": runs, "steps": steps,
            "elapsed_s": elapsed, "runs_per_s": runs / elapsed if elapsed > 0 else float("nan"),
            "submit_s": t_submitted - t0, "observed_done_s": t_seen - t0,
            "latency_p50_s": median(lat), "latency_p90_s": quantile(lat, 0.9), "latency_max_s": max(lat or [0.0]),
            "wrong": wrong, **effects}


def start_dbos_workers(procs: Procs, db: str, url: str, work: pathlib.Path, count: int,
                       concurrency: int) -> tuple[list[subprocess.Popen[bytes]], list[pathlib.Path]]:
    """``count`` DBOS processes; the first alone (DBOS.launch() migrates a fresh database),
    then the others; returns once each has registered the queue, plus 1.5 s for DBOS's queue
    manager (it looks for new queues every 1 s) to start polling it."""
    started, logs = [], []
    for i in range(count):
        ready = work / f"{db}-d{i}.ready"
        ready.unlink(missing_ok=True)
        log = work / f"{db}-d{i}.log"
        logs.append(log)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("BENCH_", "TCC_"))}
        env["PYTHONPATH"] = str(ROOT)
        started.append(procs.start([sys.executable, DBOS_CHILD, json.dumps(
            {"url": url, "executor": f"dbos-w{i}", "concurrency": concurrency, "ready": str(ready)})], env, log))
        if i == 0 or i == count - 1:
            for j in range(i + 1):
                path = work / f"{db}-d{j}.ready"
                wait_for(f"DBOS process {j} ready", path.exists, 120, logs)
    time.sleep(1.5)
    return started, logs


def dbos_throughput(procs: Procs, srv: Any, work: pathlib.Path, *, workers: int, concurrency: int, runs: int,
                    steps: int) -> dict[str, Any]:
    import psycopg
    from dbos import DBOSClient

    db = f"tput_dbos_w{workers}"
    url = srv.create(db)
    log = work / f"{db}.effects"
    log.unlink(missing_ok=True)
    started, logs = start_dbos_workers(procs, db, url, work, workers, concurrency)
    tags = [f"r{i:04d}" for i in range(runs)]
    cpu0 = children_cpu()
    client = DBOSClient(system_database_url=url)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            t0 = time.time()
            handles: list[Any] = [client.enqueue({"queue_name": "fleet", "workflow_name": "fleet_workflow", "workflow_id": tag},
                                      str(log), tag, steps, 0.0) for tag in tags]
            t_submitted = time.time()

            def done() -> Any:
                n, last = conn.execute(  # type: ignore[misc]
                    "SELECT count(*) FILTER (WHERE status IN ('SUCCESS', 'ERROR')), max(updated_at) FILTER "
                    "(WHERE status IN ('SUCCESS', 'ERROR')) FROM dbos.workflow_status WHERE queue_name = 'fleet'"
                ).fetchone()
                return (n, last) if n >= runs else None

            _, last_ms = wait_for(f"{runs} DBOS workflows to finish", done, 60 + 3.0 * runs, logs)
            t_seen = time.time()
            lat = [(u - c) / 1e3 for c, u in conn.execute(
                "SELECT created_at, updated_at FROM dbos.workflow_status WHERE queue_name = 'fleet'").fetchall()]
            wrong = []
            for tag, h in zip(tags, handles):
                got = h.get_result()
                if got != expected(tag, steps):
                    wrong.append(f"{tag}: {got!r}")
    finally:
        client.destroy()
        for p in started:
            procs.stop(p)
    effects = count_effects(log, tags, steps)
    effects["fleet_cpu_s"] = children_cpu() - cpu0
    srv.drop(db)
    return _throughput_row("dbos", workers, concurrency, runs, steps, t0, t_submitted, float(last_ms) / 1e3, t_seen,
                           lat, wrong, effects)


# ---------------------------------------------------------------- 3. idle load


def db_counters(srv: Any, db: str, statements: bool) -> dict[str, Any]:
    with srv._admin() as conn:
        xacts = conn.execute("SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s",
                             (db,)).fetchone()[0]
        conns = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (db,)).fetchone()[0]
        out: dict[str, Any] = {"t": time.time(), "xacts": int(xacts), "connections": int(conns)}
        if statements:
            rows = conn.execute(
                "SELECT s.query, sum(s.calls)::bigint FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid"
                " WHERE d.datname = %s GROUP BY s.query", (db,)).fetchall()
            out["statements"] = {q: int(c) for q, c in rows}
    return out


def idle_load(procs: Procs, srv: Any, work: pathlib.Path, system: str, *, workers: int, seconds: float,
              statements: bool) -> dict[str, Any]:
    db = f"idle_{system}"
    if system == "tcc":
        url, key = tcc_init(srv, db, work)
        started, logs = start_tcc_workers(procs, srv, db, url, key, work, [f"idle-w{i}" for i in range(workers)],
                                          ["--concurrency", "2"])
    else:
        url = srv.create(db)
        started, logs = start_dbos_workers(procs, db, url, work, workers, 2)
    try:
        time.sleep(1.0)  # past start-up (each process's first poll)
        a = db_counters(srv, db, statements)
        time.sleep(seconds)
        b = db_counters(srv, db, statements)
        for p, log in zip(started, logs):
            if p.poll() is not None:
                raise RuntimeError(f"{system} process exited during the idle window\n{tail(log)}")
    finally:
        for p in started:
            procs.stop(p)
    srv.drop(db)
    dt = b["t"] - a["t"]
    row: dict[str, Any] = {"system": system, "workers": workers, "window_s": dt,
                           "xacts_per_s": (b["xacts"] - a["xacts"]) / dt, "connections": b["connections"]}
    if statements:
        per = {q: b["statements"].get(q, 0) - a["statements"].get(q, 0) for q in b["statements"]}
        row["statements_per_s"] = sum(per.values()) / dt
        row["top_statements"] = [{"per_s": c / dt, "query": " ".join(q.split())[:160]}
                                 for q, c in sorted(per.items(), key=lambda kv: -kv[1])[:6] if c > 0]
    return row


# ---------------------------------------------------------------- server


@contextlib.contextmanager
def fleet_server(dsn: str | None, log: Any) -> Iterator[tuple[Any, bool]]:
    """The run's server (a pg_server.Server) and whether pg_stat_statements is available."""
    from benchmarks.peers import pg_server

    def with_statements(srv: Any) -> bool:
        try:
            with srv._admin() as conn:
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                conn.execute("SELECT count(*) FROM pg_stat_statements").fetchone()
            return True
        except Exception as exc:  # noqa: BLE001 - not preloaded on that server: xact counts only
            log(f"pg_stat_statements unavailable ({str(exc).strip().splitlines()[0]}); idle load in transactions/s")
            return False

    if dsn:
        srv = pg_server.Server(dsn, origin="dsn")
        try:
            yield srv, with_statements(srv)
        finally:
            srv.drop_all()
        return
    from tcc.testing.postgres import ServerUnavailable, TemporaryServer

    t = time.perf_counter()
    settings = {"shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.track": "top"}
    try:
        temp = TemporaryServer(fsync=True, settings=settings)
        temp.__enter__()
    except ServerUnavailable as exc:
        log(f"a server with pg_stat_statements did not start ({str(exc)[:200]}); trying without")
        temp = TemporaryServer(fsync=True)
        temp.__enter__()
    try:
        first = temp.create_database("fleet_admin")
        log(f"temporary server up in {time.perf_counter() - t:.1f} s")
        srv = pg_server.Server(pg_server.url_with_database(first, "postgres"), origin="temporary")
        srv.created.append("fleet_admin")
        try:
            yield srv, with_statements(srv)
        finally:
            srv.drop_all()
    finally:
        temp.__exit__(None, None, None)


# ---------------------------------------------------------------- run & report


def run(profile: dict[str, Any], srv: Any, statements: bool, work: pathlib.Path, log: Any) -> dict[str, Any]:
    from benchmarks.peers import dbos_peer

    raw: dict[str, Any] = {"server_settings": srv.settings(), "server_origin": srv.origin,
                           "pg_stat_statements": statements, "takeover": [], "throughput": [], "idle": [],
                           "problems": []}
    problems: list[str] = raw["problems"]
    have_dbos = dbos_peer.available()
    raw["dbos_version"] = dbos_peer.version() if have_dbos else None
    if not have_dbos:
        problems.append("dbos is not installed (pip install -e '.[peers]'): no DBOS numbers")
    procs = Procs()
    try:
        # (label, the worker's host, lease, seconds before the kill, worker started before the run)
        cases = [("other-host", "hostB", lease, profile["kill_after"], False) for lease in profile["leases"]]
        cases += [("same-host", "hostA", lease, profile["kill_after"], False) for lease in profile["same_host_leases"]]
        cases += [("early-kill", "hostB", lease, 1.0, True) for lease in profile["early_kill_leases"]]
        for r in range(profile["takeover_repeats"]):  # interleaved: every case, then again
            for label, host, lease, kill_after, first in cases:
                try:
                    row = takeover_round(procs, srv, work, lease=lease, worker_host=host, kill_after=kill_after,
                                         worker_first=first, label=label.replace("-", "_"), r=r)
                except Exception as exc:  # one failure must not lose the other numbers
                    problems.append(f"takeover {label} lease {lease:g} r{r}: {exc}")
                    log(f"PROBLEM: takeover {label} lease {lease:g} r{r}:\n{traceback.format_exc()}")
                    continue
                row["label"] = label
                raw["takeover"].append(row)
                if not row["continued_ok"]:
                    problems.append(f"takeover {label} lease {lease:g} r{r}: resumed at step {row['first_new_step']}"
                                    f" after step {row['last_old_step']}")
                log(f"takeover {label:10} lease {lease:g} s r{r}: {row['takeover_s'] * 1e3:,.0f} ms (floor"
                    f" {row['expected_floor_s'] * 1e3:,.0f}, claim {_ms1(row['kill_to_claim_s'])}, then"
                    f" {_ms1(row['claim_to_effect_s'])}; {row['claim_reason']})")
        for k in profile["workers"]:
            for system in ("tcc", "dbos") if have_dbos else ("tcc",):
                fn = tcc_throughput if system == "tcc" else dbos_throughput
                try:
                    row = fn(procs, srv, work, workers=k, concurrency=profile["concurrency"], runs=profile["runs"],
                             steps=profile["steps"])
                except Exception as exc:
                    problems.append(f"throughput {system} x{k}: {exc}")
                    log(f"PROBLEM: throughput {system} x{k}:\n{traceback.format_exc()}")
                    raw["throughput"].append({"system": system, "workers": k, "missing": True})
                    continue
                raw["throughput"].append(row)
                if row["wrong"] or row["missing"]:
                    problems.append(f"throughput {system} x{k}: {len(row['wrong'])} wrong results, {row['missing']}"
                                    f" missing effects: {row['wrong'][:3]}")
                log(f"throughput {system:4} x{k}: {row['runs']} runs in {row['elapsed_s']:.2f} s ="
                    f" {row['runs_per_s']:.1f} runs/s (submitting {row['submit_s']:.2f} s; latency p50"
                    f" {row['latency_p50_s']:.2f} s; dup. effects {row['duplicates']})")
        for system in ("tcc", "dbos") if have_dbos else ("tcc",):
            try:
                row = idle_load(procs, srv, work, system, workers=profile["idle_workers"], seconds=profile["idle_s"],
                                statements=statements)
            except Exception as exc:
                problems.append(f"idle {system}: {exc}")
                log(f"PROBLEM: idle {system}:\n{traceback.format_exc()}")
                continue
            raw["idle"].append(row)
            log(f"idle {system:4} x{row['workers']}: {row.get('statements_per_s', float('nan')):.1f} statements/s,"
                f" {row['xacts_per_s']:.1f} transactions/s, {row['connections']} connections")
    finally:
        procs.stop_all(grace=5.0)
        procs.kill_all()
    return raw


def _ms1(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:,.0f} ms"


def render(raw: dict[str, Any]) -> str:
    s = raw["server_settings"]
    out = [
        f"Profile `{raw['profile']}`, Python {raw['python']}, {raw['cpus']} CPUs, {raw['elapsed_s']:.0f} s;"
        f" {provenance.describe(raw.get('provenance'))};"
        f" PostgreSQL {s['server_version']} ({raw['server_origin']} server), fsync={s['fsync']},"
        f" synchronous_commit={s['synchronous_commit']}; tcc {raw['tcc_version']}, DBOS {raw['dbos_version']}.",
        "",
        "**Takeover of a dead host's run**: a `tcc run --lease L` of host hostA (an effect every"
        f" {STEP_DELAY * 1e3:.0f} ms) is SIGKILLed {raw['profile_settings']['kill_after']:g} s after an idle"
        " `tcc worker --lease L` of host hostB (same-host: hostA, which takes the run when the owner's"
        " process exits, so the floor does not apply) has started and polled once (early-kill:"
        " the worker was up before the run, and the kill comes 1 s after the run's start, before the worker's"
        " 5 s poll; the run's creation notified it). Takeover = kill -> first effect of the resumed run;"
        " floor = the lease left at the kill (L - time since the last renewal; the heartbeat renews every L/3)."
        " Medians ± half-range.",
        "",
        "| case | lease (s) | n | takeover (ms) | floor (ms) | takeover - floor (ms) | kill -> claim (ms) |"
        " claim -> first effect (ms) | claim reason |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    groups: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for r in raw["takeover"]:
        groups.setdefault((r["label"], r["lease_s"]), []).append(r)
    for (label, lease), rows in groups.items():
        def col(key: str, rows: list[dict[str, Any]] = rows) -> str:
            xs = [r[key] for r in rows if r.get(key) is not None]
            return f"{median(xs) * 1e3:,.0f} ± {spread(xs) * 1e3:,.0f}" if xs else "-"
        extra = [r["takeover_s"] - r["expected_floor_s"] for r in rows]
        reasons = ", ".join(sorted({str(r["claim_reason"]) for r in rows}))
        out.append(f"| {label} | {lease:g} | {len(rows)} | {col('takeover_s')} | {col('expected_floor_s')} |"
                   f" {median(extra) * 1e3:,.0f} ± {spread(extra) * 1e3:,.0f} | {col('kill_to_claim_s')} |"
                   f" {col('claim_to_effect_s')} | {reasons} |")
    p = raw["profile_settings"]
    out += [
        "",
        f"**Fleet throughput**: {p['runs']} runs of {p['steps']} effects each, submitted from one process once"
        f" every worker is up; --concurrency / worker_concurrency {p['concurrency']} per process; first submission"
        " -> last completion. tcc: a `tcc resume` process per run; DBOS: a thread per workflow in an"
        " already-running process, found by its 1 s queue poll.",
        "",
        "| system | processes | total concurrency | runs/s | elapsed (s) | submitting (s) | run latency p50 / p90"
        " (s) | fleet CPU per run (ms) | effect executions | result |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in raw["throughput"]:
        if r.get("missing"):
            out.append(f"| {r['system']} | {r['workers']} | - | - | - | - | - | - | - | no numbers |")
            continue
        result = "ok" if not r["wrong"] and not r["missing"] else f"{len(r['wrong'])} WRONG, {r['missing']} missing"
        if r["duplicates"]:
            result += f", {r['duplicates']} dup. effects"
        out.append(f"| {r['system']} | {r['workers']} | {r['workers'] * r['concurrency']} | {r['runs_per_s']:.2f} |"
                   f" {r['elapsed_s']:.2f} | {r['submit_s']:.2f} | {r['latency_p50_s']:.2f} / {r['latency_p90_s']:.2f}"
                   f" | {r['fleet_cpu_s'] / r['runs'] * 1e3:,.0f} | {r['executions']} | {result} |")
    measure = ("statements/s from pg_stat_statements (top level, BEGIN/COMMIT included)" if raw["pg_stat_statements"]
               else "pg_stat_statements unavailable: transactions/s only")
    out += [
        "",
        f"**Database load of an idle fleet** over {p['idle_s']:g} s: {measure}; transactions/s from pg_stat_database"
        " (reported by backends at most every 1 s, idle ones up to 10 s late).",
        "",
        "| system | idle processes | statements/s | transactions/s | connections | top statements (per s) |",
        "|---|---|---|---|---|---|",
    ]
    for r in raw["idle"]:
        top = "; ".join(f"{t['per_s']:.2f} `{t['query'][:60]}`" for t in r.get("top_statements", [])[:3])
        stm = f"{r['statements_per_s']:.2f}" if "statements_per_s" in r else "-"
        out.append(f"| {r['system']} | {r['workers']} | {stm} | {r['xacts_per_s']:.2f} | {r['connections']} |"
                   f" {top.replace('|', '/')} |")
    if raw["problems"]:
        out += ["", "Problems:", ""] + [f"- {x}" for x in raw["problems"]]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group()
    for name in PROFILES:
        group.add_argument(f"--{name}", dest="profile", action="store_const", const=name)
    parser.add_argument("--dsn", help="postgresql://USER@HOST:PORT/DB of an existing server (databases are"
                        " created and dropped there) instead of a temporary one")
    args = parser.parse_args(argv)
    profile_name = args.profile or "quick"
    profile = dict(PROFILES[profile_name])
    # this process submits runs: a host id of its own (read when tcc is imported)
    os.environ["TCC_HOST_ID"] = "bench-harness"

    def log(msg: str) -> None:
        print(msg, flush=True)

    from benchmarks.peers import _harness, pg_tcc
    from benchmarks.recovery import compile_bytecode

    ok, why = pg_tcc.available()
    if not ok:
        log(f"tcc has no PostgreSQL store here: {why}")
        return 1
    started = time.time()
    RESULTS.mkdir(parents=True, exist_ok=True)
    compile_bytecode()
    with tempfile.TemporaryDirectory(prefix="tcc-fleet-bench-") as tmp, fleet_server(args.dsn, log) as (srv, stm):
        work = pathlib.Path(tmp)
        os.chmod(work, 0o700)
        origin = provenance.begin(work)
        raw = run(profile, srv, stm, work, log)
    raw.update(provenance=provenance.end(origin), profile=profile_name, profile_settings=profile, python=platform.python_version(),
               machine=platform.machine(), cpus=os.cpu_count(), started=started, tcc_version=pg_tcc.version(),
               elapsed_s=time.time() - started, step_delay_s=STEP_DELAY)
    return _harness.write_results(RESULTS, f"fleet-{profile_name}", raw, render, log)


if __name__ == "__main__":
    sys.exit(main())
