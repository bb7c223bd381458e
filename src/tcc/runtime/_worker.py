"""``tcc worker``: a supervisor that keeps a store's runs moving.

Every poll it looks at the tenant's unfinished runs and resumes, each in its
own ``tcc resume`` subprocess (at most ``concurrency`` at once):

* ``queued`` runs (``tcc submit``), in the order they were submitted;
* ``running`` runs whose owner is dead -- its process is gone from this host,
  or its lease expired without a heartbeat (a dead-man switch);
* ``sleeping`` runs whose wake time has come;
* ``waiting`` runs whose awaited signal has arrived, or whose child run
  (``tcc.spawn``) has finished.

A run whose resume fails (exit code not 0) is retried after 1 s (or the poll
interval), then 2, 4, ... up to 5 minutes, instead of at every poll.

On a PostgreSQL store the worker is one of a fleet: it does not list the runs
but claims due ones (``Store.claim_due``: ``FOR UPDATE SKIP LOCKED``, the exact
rule below checked for each candidate, epoch + 1) and hands each claim to its
``tcc resume`` (``--claimed-epoch``); between polls it sleeps until a
notification of new work (``LISTEN``), a child's exit, or the next time a run
becomes due, and polls every ``poll`` seconds in any case (notifications are
lost while the listening connection is down).

Every takeover increments the run's epoch, so a zombie owner that wakes up
later is fenced and cannot commit.  On SIGTERM the worker stops starting runs,
asks its children to stop after their current commit, waits for them, and
exits.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import TYPE_CHECKING, Any, Callable, cast

from .._proc import pid_alive, proc_stat
from ..errors import RunNotFoundError, StoreConnectionError, StoreCorruptError
from ..store import FINISHED_STATUSES, HOST, LIVE_STATUSES, RunInfo, Store
from ._markers import executed
from ._pinning import awaiting_decision
from ._scripts import script_display_name

if TYPE_CHECKING:
    import subprocess  # imported where a process is started: not by every `tcc resume`

BACKOFF_MAX = 300.0  # seconds between resumes of a run whose resumes keep failing
# A worker's claim holds the run this long at least, while the `tcc resume` it starts gets
# going (imports, the store, the script) and takes it over: a shorter --lease would let
# another host claim it first, again and again.
HANDOVER_LEASE = 10.0
# A run whose code changed under the refuse policy is looked at again this often (it is
# said once; meanwhile it is not fetched with the due runs, so it cannot crowd them out).
UNDECIDED_RECHECK = 60.0
HUNG_CHECK = 2.0  # seconds between two looks at one child's lease


def pending_waits(store: Store, run_id: str) -> list[dict[str, Any]]:
    """Waits the run registered whose signal has not been consumed yet."""
    waits: dict[str, dict[str, Any]] = {}
    for e in store.events(run_id):
        data = dict(e.data)
        if e.kind == "wait" and "id" in data:
            waits[data["id"]] = data
        elif e.kind == "wait_satisfied":
            waits.pop(cast(str, data.get("id")), None)
    out = []
    for wait_id, data in waits.items():
        state = store.signal_state(run_id, wait_id)
        if state != "consumed":
            out.append({**data, "signal": state or "not sent"})
    return out


def wake_time(store: Store, run_id: str) -> float | None:
    until = None
    for e in store.events(run_id):
        if e.kind == "parked" and dict(e.data).get("status") == "sleeping":
            until = float(dict(e.data).get("until", 0.0))
    return until


def wait_deadline(store: Store, run_id: str) -> float | None:
    """When the wait a waiting run parked at times out (``tcc.wait_for(..., timeout=)``),
    if it has a timeout."""
    deadline = None
    for e in store.events(run_id):
        if e.kind == "parked":
            value = dict(e.data).get("deadline")
            deadline = float(value) if isinstance(value, (int, float)) else None
    return deadline


def awaited_child(store: Store, run_id: str) -> str | None:
    """The child run a waiting run parked on (``tcc.spawn``), if that is what it waits for."""
    child = None
    for e in store.events(run_id):
        if e.kind == "parked":
            child = dict(e.data).get("child")
    return child if isinstance(child, str) else None


def owner_dead(run: RunInfo, now: float) -> bool:
    """Whether the owner of a running run has let go of it: its lease ran out, or its
    process is gone from this host."""
    if run.lease_expiry <= now:
        return True
    if run.owner_host == HOST:
        return not pid_alive(run.owner_pid)
    return False


def _descends(pid: int, ancestor: int) -> bool:
    """Whether process ``pid`` is ``ancestor`` or runs under it (its parent's parent ..., a
    few levels: a worker's ``command`` may wrap `tcc resume` in another program)."""
    for _level in range(8):
        if pid == ancestor:
            return True
        fields = proc_stat(pid)
        if fields is None or len(fields) < 2 or not fields[1].isdigit() or int(fields[1]) <= 1:
            return False
        pid = int(fields[1])
    return False


def _stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (SIGSTOP, a debugger): state T or t in /proc."""
    fields = proc_stat(pid)
    return fields is not None and bool(fields) and fields[0] in ("T", "t")


def unstarted_fork(run: RunInfo, store: Store | None = None) -> bool:
    """Whether ``run`` is a fork (``tcc fork``) that nothing has resumed yet: it starts only
    with an explicit ``tcc resume`` (README), never by a worker.  A fork is made at epoch 1,
    owned by the process that made it; the first resume's claim moves it to epoch 2.  A
    ``tcc upgrade`` claims it too, without running it: past epoch 1 its events tell
    (read from ``store``; without one, a fork past epoch 1 counts as started)."""
    if run.parent is None or run.status != "running":
        return False
    if run.epoch == 1:
        return True
    if store is None:
        return False
    # fixed for an epoch (a resume claims a new one); the run's creation time tells a run
    # deleted and made again under the same id
    key = (str(getattr(store, "path", id(store))), store.tenant, run.run_id, run.epoch, run.created)
    known = _FORK_VERDICTS.get(key)
    if known is None:
        if len(_FORK_VERDICTS) >= 1024:
            _FORK_VERDICTS.clear()
        known = _FORK_VERDICTS[key] = not executed(store.events(run.run_id))
    return known


# (store, run id, epoch) -> whether that fork is unstarted: a worker asks at every poll
_FORK_VERDICTS: dict[tuple[str, str, str, int, float], bool] = {}


def due(store: Store, run: RunInfo, now: float) -> str | None:
    """Why the worker should resume ``run`` now, or None."""
    if run.status == "queued":  # unless a worker's resume holds it (its lease runs)
        return "submitted" if owner_dead(run, now) else None
    if run.status == "running":
        if unstarted_fork(run, store):
            return None
        return "owner dead" if owner_dead(run, now) else None
    if run.status == "sleeping":
        until = wake_time(store, run.run_id)
        return "timer due" if until is None or until <= now else None
    if run.status == "waiting":
        child = awaited_child(store, run.run_id)
        if child is not None:
            try:
                status = store.get_run(child).status
            except RunNotFoundError:  # lost: resuming starts it again, or reports why not
                return "child missing"
            return "child finished" if status in FINISHED_STATUSES else None
        if any(w["signal"] == "pending" for w in pending_waits(store, run.run_id)):
            return "signal arrived"
        deadline = wait_deadline(store, run.run_id)
        if deadline is not None and deadline <= now:  # the resumed wait raises TimeoutError
            return "wait timed out"
    return None


def resume_command(store: Store, run_id: str, command: list[str] | None = None, *,
                   claimed_epoch: int | None = None, lease: float | None = None) -> list[str]:
    """The command line of a ``tcc resume`` of ``run_id`` in its own process.

    "--" before the run id, and --tenant=: a run id or tenant starting with "-" (older tcc
    allowed one; "-h" printed help and exited 0 every poll) is never read as an option."""
    base = command or [sys.executable, "-m", "tcc"]
    extra = [f"--claimed-epoch={claimed_epoch}"] if claimed_epoch is not None else []
    if lease is not None:
        extra.append(f"--lease={lease:g}")
    return [*base, "resume", f"--tenant={store.tenant}", *extra, "--", run_id]


def resume_env(store: Store, env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a resume process: the store in $TCC_STORE (a database URL may hold
    a password, which a command line would show to every user of the host)."""
    out = dict(os.environ if env is None else env)
    out["TCC_STORE"] = getattr(store, "url", None) or store.path
    return out


def not_due_reason(store: Store, run: RunInfo, now: float) -> str:
    """Why resuming ``run`` now would do nothing, said for a person (``due`` said None)."""
    if run.status in FINISHED_STATUSES:
        return f"run {run.run_id} is already {run.status}; there is nothing to resume"
    if run.status == "running":
        return (f"run {run.run_id} is running and its owner ({run.owner_host}:{run.owner_pid}) "
                "still holds it")
    if run.status == "sleeping":
        until = wake_time(store, run.run_id) or now
        return f"run {run.run_id} sleeps for another {until - now:.0f} s; it resumes when that is over"
    if run.status == "queued":
        return (f"run {run.run_id} is queued and a worker ({run.owner_host}:{run.owner_pid}) is "
                "starting it")
    waits = pending_waits(store, run.run_id)
    if waits:
        what = ", ".join(f"{w.get('kind', 'signal')} {w['id']}" for w in waits)
        return f"run {run.run_id} waits for {what}; answer it first"
    child = awaited_child(store, run.run_id)
    if child is not None:
        return f"run {run.run_id} waits for its child run {child} to finish"
    return f"run {run.run_id} is {run.status} and not due"


_DISCARD: Any = -3  # subprocess.DEVNULL, without importing subprocess here


def start_resume(store: Store, run_id: str, *, command: list[str] | None = None,
                 env: dict[str, str] | None = None, stderr: Any = _DISCARD
                 ) -> subprocess.Popen[bytes]:
    """Resume ``run_id`` in a ``tcc resume`` process of its own, as the worker does, if it
    is due (:func:`due`); else :class:`~tcc.errors.UsageError` saying why not.  Records a
    ``resume_requested`` event with the process id.  For a front end that must not block
    (the dashboard): the run's progress is in the store, not in the returned process.
    ``stderr``: as :class:`subprocess.Popen`'s (default: discarded)."""
    import subprocess

    from ..errors import UsageError

    assert _DISCARD == subprocess.DEVNULL

    run = store.get_run(run_id)
    reason = due(store, run, time.time())
    if reason is None:
        raise UsageError(not_due_reason(store, run, time.time()))
    proc = subprocess.Popen(resume_command(store, run_id, command), env=resume_env(store, env),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=stderr,
                            start_new_session=True)
    store.add_event(run_id, "resume_requested", {"pid": proc.pid, "reason": reason})
    return proc


class Worker:
    """``tcc worker``: supervise a store, resuming runs whose owner died, that are due (a
    sleep ended, a signal or a child's end arrived), up to ``concurrency`` at once."""

    def __init__(
        self,
        store: Store,
        *,
        concurrency: int = 4,
        poll: float = 1.0,
        command: list[str] | None = None,
        env: dict[str, str] | None = None,
        log: Callable[[str], None] = print,
        lease: float = 30.0,
    ) -> None:
        self.store = store
        self.concurrency = max(1, concurrency)
        self.poll = poll
        self.lease = lease
        # a store that hands out due runs to a fleet of workers (PostgreSQL)
        self.fleet = callable(getattr(store, "claim_due", None))
        self.audited = False  # a fleet worker lists every run once, to report damaged ones
        self.watched: dict[int, int] = {}  # pid -> pidfd of the live run owners of this host
        self.listener: Any = None
        self.command = command or [sys.executable, "-m", "tcc"]
        self.env = env
        self.log = log
        self.children: dict[str, subprocess.Popen[bytes]] = {}
        self.errs: dict[str, Any] = {}  # run id -> temporary file holding the child's stderr
        # run id -> (failed resumes in a row, not before this time): a resume that keeps
        # failing (a deleted script, changed code) is retried ever more slowly, not every poll
        self.backoff: dict[str, tuple[int, float]] = {}
        self.damaged: set[str] = set()  # runs whose record failed verification (said once)
        # runs whose code changed under refuse (said once) -> when that was last looked at
        self.waiting_decision: dict[str, float] = {}
        self.hung_checked: dict[str, float] = {}  # run id -> when its child was last looked at
        # forks nobody started (run id -> when seen): not fetched again for a while
        self.unstarted_forks: dict[str, float] = {}
        self.stopping = False

    def stop(self, *_args: Any) -> None:
        self.stopping = True

    def _finished(self, run_id: str, code: int) -> None:
        """Log a child's exit (a failure with the last line it wrote to stderr), and the
        warnings and notes it wrote (`tcc: warning: ...`: what a resume says only there)."""
        err = self.errs.pop(run_id, None)
        why = ""
        if err is not None:
            err.seek(0)
            lines = [ln.strip() for ln in err.read().decode(errors="replace").splitlines() if ln.strip()]
            err.close()
            for line in lines:
                if line.startswith(("tcc: warning:", "tcc: note:")):
                    self.log(f"worker: run {run_id}: {line[len('tcc: '):][:1000]}")
            if code != 0 and lines:
                why = f": {lines[-1][:300]}"
        if code == 0:
            self.backoff.pop(run_id, None)
            self.log(f"worker: run {run_id} exited with {code}{why}")
            return
        try:
            status = self.store.get_run(run_id).status
        except Exception:  # noqa: BLE001 - unknown: treated as still live
            status = "running"
        if status not in LIVE_STATUSES:  # failed, cancelled...: nothing to try again
            self.backoff.pop(run_id, None)
            self.log(f"worker: run {run_id} exited with {code}{why} (the run is {status}; the "
                     "worker leaves it)")
            return
        failures = self.backoff.get(run_id, (0, 0.0))[0] + 1
        delay = min(BACKOFF_MAX, max(self.poll, 1.0) * 2 ** min(failures - 1, 16))
        self.backoff[run_id] = (failures, time.time() + delay)
        self.log(f"worker: run {run_id} exited with {code}{why} (failure {failures} in a row; "
                 f"next try in {delay:.0f} s at the earliest)")

    def _stop_hung(self) -> None:
        """A resume this worker started whose run's lease ran out is hung (stopped, or stuck
        where its heartbeat cannot run): another worker would take the run over, but this
        one never claims its own children's runs.  Kill it; the run is then taken up as any
        run whose owner died (the lease makes that safe: the child is fenced anyway)."""
        now = time.time()
        for run_id, proc in list(self.children.items()):
            if proc.poll() is not None or now - self.hung_checked.get(run_id, 0.0) < HUNG_CHECK:
                continue
            self.hung_checked[run_id] = now
            try:
                run = self.store.get_run(run_id)
            except Exception:  # noqa: BLE001 - read again at the next check
                continue
            # a lease renewed late (a long C call holding the GIL, a write queued behind the
            # child's own) is not a hang: a whole lease more must pass, unless it is stopped
            owner = run.owner_pid  # the resume itself: this child, or one under its command's wrapper
            if run.status == "running" and run.owner_host == HOST and _descends(owner, proc.pid) \
                    and run.lease_expiry < now and (now - run.lease_expiry > self.lease or _stopped(owner)):
                self.log(f"worker: run {run_id}: its resume (pid {owner}) has not renewed its "
                         f"lease for {now - run.lease_expiry:.0f} s; stopping it (SIGKILL)")
                if owner != proc.pid:
                    try:
                        os.kill(owner, signal.SIGKILL)
                    except OSError:
                        pass
                proc.kill()

    def _reap(self) -> None:
        self._stop_hung()
        now = time.time()
        for run_id, seen in list(self.unstarted_forks.items()):
            if now - seen >= UNDECIDED_RECHECK:
                del self.unstarted_forks[run_id]
        for run_id, proc in list(self.children.items()):
            code = proc.poll()
            if code is not None:
                del self.children[run_id]
                self.hung_checked.pop(run_id, None)
                self._finished(run_id, code)

    def tick(self) -> int:
        """One poll: start resumes for due runs; return how many were started."""
        self._reap()
        if self.fleet:
            return self._claim_tick()
        started = 0
        now = time.time()
        damaged: list[tuple[str, str]] = []
        runs = self.store.list_runs(damaged=damaged)
        self._say_damaged(damaged)
        # queued runs in the order they were submitted, after the runs already under way
        for run in sorted(runs, key=lambda r: (r.status == "queued", r.created if r.status == "queued"
                                               else r.updated, r.run_id)):
            if self.stopping or len(self.children) >= self.concurrency:
                break
            if run.run_id in self.children or run.status not in LIVE_STATUSES:
                continue
            if self.backoff.get(run.run_id, (0, 0.0))[1] > now:
                continue
            try:
                reason = due(self.store, run, now)
                if reason is None or self._undecided(run.run_id):
                    continue
            except StoreCorruptError as exc:  # its trail, a child's record: needs a person
                self._say_damaged([(run.run_id, str(exc))])
                continue
            self._start(run.run_id, reason)
            started += 1
        return started

    def _say_damaged(self, damaged: list[tuple[str, str]]) -> None:
        for run_id, why in damaged:  # the other runs are served; this one needs a person
            if run_id not in self.damaged:
                self.damaged.add(run_id)
                self.log(f"worker: skipping run {run_id}: {why}")

    def _claim_tick(self) -> int:
        """One poll of a fleet store: claim due runs (each checked by :func:`due`) and hand
        each to a resume of its own."""
        if not self.audited:  # once, at start: damage in runs that are not due is said too
            damaged: list[tuple[str, str]] = []
            self.store.list_runs(damaged=damaged)
            self._say_damaged(damaged)
            self.audited = True
        free = self.concurrency - len(self.children)
        if self.stopping or free <= 0:
            return 0

        def check(run: RunInfo) -> tuple[str, Any]:
            now = time.time()
            if run.run_id in self.children or self.backoff.get(run.run_id, (0, 0.0))[1] > now:
                return ("skip", None)
            if unstarted_fork(run, self.store):  # fetched by its lease; left out of the next polls
                self.unstarted_forks[run.run_id] = now
                return ("skip", None)
            reason = due(self.store, run, now)
            if reason is None:  # not due after all: when it will be, if by time
                when = wake_time(self.store, run.run_id) if run.status == "sleeping" else \
                    wait_deadline(self.store, run.run_id) if run.status == "waiting" else None
                return ("later", when)
            if self._undecided(run.run_id):
                return ("skip", None)
            return ("claim", reason)

        claim_due = cast(Any, self.store).claim_due
        damaged = []
        owners: list[int] = []
        now = time.time()
        # runs this worker would only skip are not fetched: they must not fill the window
        # the due runs are read in (a dozen runs whose resumes keep failing, say)
        skipped = [r for r, (_n, until) in self.backoff.items() if until > now]
        skipped += [r for r, seen in self.waiting_decision.items() if now - seen < UNDECIDED_RECHECK]
        skipped += [r for r, seen in self.unstarted_forks.items() if now - seen < UNDECIDED_RECHECK]
        claimed = claim_due(free, lease=max(self.lease, HANDOVER_LEASE), check=check,
                            exclude=[*self.children, *self.damaged, *skipped], damaged=damaged,
                            watch=owners)
        self._say_damaged(damaged)
        self._watch({pid for pid in owners if not any(p.pid == pid for p in self.children.values())})
        for run, reason in claimed:
            self._start(run.run_id, reason, claimed_epoch=run.epoch)
        return len(claimed)

    def _watch(self, pids: set[int]) -> None:
        """Hold a pidfd of each of ``pids`` (the live owners of runs on this host, not this
        worker's own children): :meth:`_idle` wakes the moment one of them exits, so a run
        of a `tcc run` that died here is taken over at once, not at the next poll."""
        for pid in set(self.watched) - pids:
            os.close(self.watched.pop(pid))
        for pid in pids - set(self.watched):
            try:
                self.watched[pid] = os.pidfd_open(pid)
            except (OSError, AttributeError):  # gone already (the next poll takes its run
                pass                            # over), or no pidfds here (the poll does)

    def _start(self, run_id: str, reason: str, *, claimed_epoch: int | None = None) -> None:
        args = resume_command(self.store, run_id, self.command, claimed_epoch=claimed_epoch,
                              lease=self.lease)
        self.log(f"worker: resuming {run_id} ({reason})")
        import subprocess  # here: a `tcc resume` imports this module, and never gets here
        import tempfile

        err = tempfile.TemporaryFile()
        self.errs[run_id] = err
        self.children[run_id] = subprocess.Popen(
            args, env=self._child_env(), stdout=subprocess.DEVNULL, stderr=err
        )

    def _idle(self) -> None:
        """Wait for the next poll: ``poll`` seconds at most; on a fleet store less, until a
        notification of new work, a child's exit, or the next time a run becomes due."""
        timeout = self.poll
        if self.fleet:
            try:
                soon = cast(Any, self.store).next_due()
            except StoreConnectionError:
                soon = None
            if soon is not None and soon > 0:
                timeout = min(timeout, soon + 0.02)
        deadline = time.monotonic() + timeout
        running = len(self.children)
        while not self.stopping:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            # short steps: a SIGTERM is noticed within 0.5 s (an interrupted select or
            # sleep carries on with its timeout), a child's exit within 0.1 s
            step = min(left, 0.1 if running else 0.5)
            if self.listener is not None:
                if self.listener.wait(step, list(self.watched.values())):
                    return
            else:
                time.sleep(step)
            if running and any(p.poll() is not None for p in self.children.values()):
                return  # a slot is free: look for more work now

    def _undecided(self, run_id: str) -> bool:
        """Whether the run's files changed and its policy is ``refuse``: a resume would
        only be refused again, so the run waits for a person (said once, and in `tcc ls`)."""
        changed = awaiting_decision(self.store.events(run_id))
        if not changed:
            self.waiting_decision.pop(run_id, None)
            return False
        said = run_id in self.waiting_decision
        self.waiting_decision[run_id] = time.time()
        if not said:
            self.log(f"worker: run {run_id} needs a decision: its code changed since it recorded "
                     f"it ({', '.join(script_display_name(n) for n in changed)}) and its policy is "
                     f"refuse; `tcc resume --code pinned {run_id}` continues it on that code, "
                     f"`tcc upgrade {run_id}` moves it onto the new code")
        return True

    def _child_env(self) -> dict[str, str]:
        return resume_env(self.store, self.env)

    def serve(self, *, once: bool = False) -> int:
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)
        if self.fleet and not once:  # listening before the first poll: no work slips between
            self.listener = cast(Any, self.store).listener()
            listening = self.listener.start()
            self.log(f"worker: host {HOST}, {'listening for new work' if listening else 'polling'} "
                     f"on {self.store.path} (tenant {self.store.tenant}; polls every {self.poll:g} s)")
        unreachable = False
        while not self.stopping:
            try:
                self.tick()
            except StoreConnectionError as exc:
                if once:
                    raise
                # the database is down or unreachable (a restart, a network cut): keep the
                # started resumes and poll again; say so once per outage
                if not unreachable:
                    self.log(f"worker: {exc}; retrying every {self.poll:g} s")
                unreachable = True
            else:
                if unreachable:
                    self.log("worker: the store is reachable again")
                unreachable = False
            if once:
                for run_id, proc in self.children.items():  # one poll: let them finish
                    proc.wait()
                    self._finished(run_id, proc.returncode)
                self.children.clear()
                break
            self._idle()
        if self.listener is not None:
            self.listener.close()
        self._watch(set())
        for proc in self.children.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)  # they stop after their current commit
        for run_id, proc in self.children.items():
            proc.wait()
            self._finished(run_id, proc.returncode)
        return 0
