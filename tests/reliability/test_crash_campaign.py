"""Mixed SIGKILL campaign: `tcc run`, `resume`, `worker`, `gc`, `gc --compact` and `fork` on one store.

The reliability issue's crash campaign.  Each job (``TCC_RELIABILITY_JOBS``
[2] threads, each with its own stores) runs the ledger agent
(tests/_support/agents/ledger_agent.py: one ledger line per effect, tagged
with the effect's idempotency key ``RUN_ID:N``) in several runs that share
one store folder and one ledger.  A loop picks an action at random, starts
it as its own process group and SIGKILLs the group after a random delay:

* ``run``      `tcc run --run-id R` of a new run (or of one a kill left in doubt);
* ``resume``   `tcc resume R` of an unfinished run or fork;
* ``worker``   `tcc worker --once`, which resumes every dead run in child
  processes; the kill takes the worker with its children (a machine dying)
  or, one time in three, the worker alone (its orphaned resumes go on);
* ``gc``       `tcc gc` (retention deletes snapshots, chunks are released);
* ``compact``  `tcc gc --compact` (needs the store to itself: a clear refusal
  is accepted while orphaned resumes still hold it);
* ``fork``     `tcc fork P --run-id F` of a run that exists;
* ``overlap``  a worker and a manual `tcc resume` at once, killed independently.

The delay is uniform from 0.02 s to a horizon: 0.6 s for run/resume (with
an occasional longer one so that kills also land after the final commit),
1.25x the measured natural duration for the short commands.  So kills land
in interpreter start-up, store opening, effects, snapshot commits, retention
deletes, the compaction copy and swap, and the fork transaction.  Each
store also gets a random commit durability (sync, group or none: all three
must survive process kills).

After ``TCC_CAMPAIGN_SEGMENT_KILLS`` [250] kills a job finishes its store
(every run and fork resumed to the end without kills), checks it, and starts
a new one.  The checks, per run:

* status completed, the exact result, and a journal with exactly STEPS
  completed calls ``OWNER:1..STEPS`` and no call left in flight;
* every acknowledged (journaled) call's line is in the ledger, with the
  journaled value: ``lost_steps`` must be 0;
* duplicates (ledger lines beyond the first, per key) <= the kills the run
  took (a kill of a worker counts against every unfinished run), all with
  the same value (re-issued with the recorded arguments); with a verify
  probe (VERIFY=1) zero;
* in-doubt re-issues (``in_doubt_*`` events) <= the kills the run took;
* a fork's calls are its ancestors' journaled calls up to the fork point,
  with their values, then its own ``FORK:N``; no ledger line exists for a
  call that no run completed (so a fork never wrote under its parent's keys);
* the store opens, `tcc ls --json` lists every run that was ever confirmed,
  and `tcc gc` and `tcc gc --compact` succeed.

Two bugs this campaign found are fixed and fail it again if they return:
`tcc fork` of a run killed before its first snapshot was an internal error,
and a killed compaction left its copy (``compact.PID/``) behind for good
(``stale_compact_dirs`` counts copies left after a final `tcc gc --compact`).
``refused`` counts clear refusals of racing commands ("owned by", compaction
"open in another process"), ``worker_child_failures`` nonzero exits of a
worker's resumes (their stderr is discarded by the worker; a claim lost to a
racing resume is one).

One summary line starting with ``kills=`` is printed per test (for
benchmarks/reliability_report.py).  Sizes: ``TCC_CAMPAIGN_KILLS`` [30] in CI,
``TCC_SLOW_CAMPAIGN_KILLS`` [10000] and ``TCC_SLOW_CAMPAIGN_VERIFY_KILLS``
[2000] in the slow tier; ``TCC_RELIABILITY_SEED`` fixes the choices.  The same campaign
runs on encrypted stores (a store key in ``TCC_STORE_KEY_FILE``):
``TCC_CAMPAIGN_ENCRYPTED_KILLS`` [20] in CI, ``TCC_SLOW_CAMPAIGN_ENCRYPTED_KILLS`` [2000]
in the slow tier.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import ctypes
import dataclasses
import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from tests._support.reliability import LEDGER_AGENT, is_encrypted_store, store_key_in_environment
from tests._support.runs import Cli


KILLS = int(os.environ.get("TCC_CAMPAIGN_KILLS", "30"))
SLOW_KILLS = int(os.environ.get("TCC_SLOW_CAMPAIGN_KILLS", "10000"))
SLOW_VERIFY_KILLS = int(os.environ.get("TCC_SLOW_CAMPAIGN_VERIFY_KILLS", "2000"))
# the same campaign on encrypted stores (a key in TCC_STORE_KEY_FILE): a CI-sized and a slow run
ENCRYPTED_KILLS = int(os.environ.get("TCC_CAMPAIGN_ENCRYPTED_KILLS", "20"))
SLOW_ENCRYPTED_KILLS = int(os.environ.get("TCC_SLOW_CAMPAIGN_ENCRYPTED_KILLS", "2000"))
SEGMENT_KILLS = int(os.environ.get("TCC_CAMPAIGN_SEGMENT_KILLS", "250"))
SEED = int(os.environ.get("TCC_RELIABILITY_SEED", "20261130"))
JOBS = max(1, int(os.environ.get("TCC_RELIABILITY_JOBS", "2")))

STEPS = 40
DELAY = "0.01"  # seconds of sleep inside each effect (x random(), twice): commits are a large share
EXPECTED = {"steps": STEPS, "total": sum(range(STEPS)), "salts": STEPS}
MAX_UNFINISHED = 3  # runs in flight at once per store (forks may add two more)
RUN_HORIZON = 0.6  # run/resume kill delays: uniform(0.02, 0.6), as the issue suggests
FINISH_TIMEOUT = 180.0  # an unkilled command taking longer than this is a hang
ACTIONS = ("run", "resume", "worker", "gc", "compact", "fork", "overlap")
DURABILITIES = ("sync", "sync", "group", "none")
# Initial horizons of the commands whose kill delay adapts to their measured natural duration.
HORIZONS = {"worker": 1.5, "gc": 0.35, "compact": 0.4, "fork": 0.35}

PR_SET_CHILD_SUBREAPER = 36
CHECK_LOCK = threading.Lock()  # in-process store reads: one at a time
LIVE: set[subprocess.Popen[str]] = set()  # every process group started and not yet collected
LIVE_LOCK = threading.Lock()


# ------------------------------------------------------------- processes


def set_subreaper(on: bool) -> bool:
    """Adopt orphans (a killed worker's resumes) so they are reaped at once, not by a slow init.

    Without it a killed worker's children linger as zombies of PID 1 for up
    to seconds in containers, and tcc's owner-alive check (``kill(pid, 0)``)
    reads a zombie as a live owner.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def group_members(pgid: int) -> list[tuple[int, int]]:
    """(pid, ppid) of every process (zombies included) in process group ``pgid``."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                fields = fh.read().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            out.append((int(name), int(fields[1])))
    return out


def reap_group(pgid: int, block: bool) -> int:
    """Reap the group's processes that are our children; return how many members remain."""
    remaining = 0
    with LIVE_LOCK:
        ours = {p.pid for p in LIVE}  # never reap a tracked process behind its Popen's back
    for pid, ppid in group_members(pgid):
        if ppid != os.getpid() or pid in ours:
            remaining += 1
            continue
        try:
            done, _status = os.waitpid(pid, 0 if block else os.WNOHANG)
        except ChildProcessError:
            continue
        if done == 0:
            remaining += 1
    return remaining


def kill_group(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


class Attempt:
    """One tcc command, started as its own process group, SIGKILLed after ``delay`` if still running."""

    def __init__(self, cli: Cli, action: str, args: tuple[str, ...], delay: float | None,
                 whole_group: bool = True) -> None:
        self.action, self.args, self.delay, self.whole_group = action, args, delay, whole_group
        self.killed = False
        self.hung = False
        self.started = time.monotonic()
        self.proc = subprocess.Popen(cli.cmd(*args), env=cli.env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, start_new_session=True)
        with LIVE_LOCK:
            LIVE.add(self.proc)
        self.out = self.err = ""
        self.duration = 0.0

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.killed = True
            if self.whole_group:
                kill_group(self.proc)
            else:
                self.proc.kill()

    def collect(self) -> None:
        try:
            self.out, self.err = self.proc.communicate(timeout=FINISH_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.hung = True
            kill_group(self.proc)
            self.out, self.err = self.proc.communicate()
        self.duration = time.monotonic() - self.started
        with LIVE_LOCK:
            LIVE.discard(self.proc)
        if self.killed and self.whole_group:
            reap_group(self.proc.pid, block=True)

    @property
    def landed(self) -> bool:
        """The SIGKILL hit a running process (not one that had just exited)."""
        return self.killed and self.proc.returncode == -signal.SIGKILL

    @property
    def code(self) -> int:
        return self.proc.returncode

    def json_out(self) -> dict[str, Any] | None:
        lines = self.out.strip().splitlines()
        try:
            doc = json.loads(lines[-1]) if lines else None
        except ValueError:
            return None
        return doc if isinstance(doc, dict) else None

    def describe(self) -> str:
        tail = "\n".join(self.err.strip().splitlines()[-6:])
        return f"`tcc {' '.join(self.args)}` exited {self.code} after {self.duration:.2f} s: {tail!r}"


def supervise(attempts: list[Attempt]) -> None:
    """Kill each attempt at its delay (if it is still running), then collect them all."""
    t0 = time.monotonic()
    for a in sorted((a for a in attempts if a.delay is not None), key=lambda a: a.delay or 0.0):
        assert a.delay is not None
        try:
            a.proc.wait(timeout=max(0.0, t0 + a.delay - time.monotonic()))
        except subprocess.TimeoutExpired:
            a.kill()
    for a in attempts:
        a.collect()


# ------------------------------------------------------------------ state


@dataclasses.dataclass
class Run:
    """One run (or fork) of a store, as the campaign knows it."""

    run_id: str
    fork_of: str | None = None
    # doubt: may not exist (its creating command was killed); live: exists, unfinished;
    # done: completed; absent: never created
    state: str = "doubt"
    kills: int = 0  # kills of processes that may have been driving it


@dataclasses.dataclass
class Figures:
    kills: int = 0
    by_action: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    runs: int = 0
    completed_exactly: int = 0
    forks: int = 0
    lost_steps: int = 0
    duplicates: int = 0
    in_doubt: int = 0
    refused: int = 0
    steals: int = 0
    worker_child_failures: int = 0
    stale_compact_dirs: int = 0
    stores: int = 0
    actions: int = 0
    problems: list[str] = dataclasses.field(default_factory=list)

    def add(self, other: Figures) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


def ledger_lines(path: pathlib.Path) -> tuple[dict[str, list[str]], list[str]]:
    """The ledger's values by idempotency key, and any malformed (torn) lines."""
    values: dict[str, list[str]] = collections.defaultdict(list)
    torn = []
    if path.exists():
        for line in path.read_text().splitlines():
            key, sep, value = line.partition(" ")
            if not sep or ":" not in key or not value.isdigit():
                torn.append(line)
            else:
                values[key].append(value)
    return values, torn


def read_store(store_dir: pathlib.Path) -> dict[str, dict[str, Any]]:
    """Every run of the store, read in this process: status, result, completed calls, events."""
    from tcc.runtime._journal import logged_calls
    from tcc.store import open_store

    out: dict[str, dict[str, Any]] = {}
    with CHECK_LOCK, open_store(store_dir, create=False) as store:
        for info in store.list_runs():
            run = store.get_run(info.run_id)
            calls = logged_calls(store.journal(run.run_id))
            kinds = collections.Counter(e.kind for e in store.events(run.run_id))
            out[run.run_id] = {
                "status": run.status,
                "result": json.loads(run.result or b"{}").get("value"),
                "calls": [(c.key, c.outcome) for c in calls],
                "in_doubt": kinds["in_doubt_reissued"] + kinds["in_doubt_verified"],
            }
    return out


# ------------------------------------------------------------------- a job


class Job:
    """One thread of the campaign: stores one after another, ``SEGMENT_KILLS`` kills each."""

    def __init__(self, root: pathlib.Path, index: int, seed: int, verify: bool,
                 stop: threading.Event) -> None:
        self.root, self.index, self.verify, self.stop = root, index, verify, stop
        self.rng = random.Random(f"{seed}-{index}")
        self.fig = Figures()
        self.horizon = dict(HORIZONS)
        self.orphans: list[int] = []  # process groups of killed workers whose resumes go on

    # -- the campaign

    def campaign(self, kills: int) -> Figures:
        while self.fig.kills < kills and not self.stop.is_set():
            self.segment(min(SEGMENT_KILLS, kills - self.fig.kills))
        return self.fig

    def segment(self, kills: int) -> None:
        self.tag = f"j{self.index}s{self.fig.stores}"
        folder = self.root / self.tag
        folder.mkdir(parents=True)
        self.fig.stores += 1
        self.durability = self.rng.choice(DURABILITIES)
        env = {"LEDGER": str(folder / "ledger.txt"), "DELAY": DELAY, "STEPS": str(STEPS),
               "TCC_DURABILITY": self.durability, "VERIFY": "1" if self.verify else "0"}
        self.cli = Cli(folder, **env)
        self.ledger = folder / "ledger.txt"
        self.runs: dict[str, Run] = {}
        self.made = 0
        goal = self.fig.kills + kills
        while self.fig.kills < goal and not self.stop.is_set():
            self.orphans = [g for g in self.orphans if reap_group(g, block=False)]
            self.act(self.pick())
        if not self.stop.is_set():
            self.finish()
            self.check()

    def problem(self, text: str) -> None:
        self.fig.problems.append(f"[{self.tag} durability={self.durability}] {text}")

    def unfinished(self) -> list[Run]:
        return [r for r in self.runs.values() if r.state in ("live", "doubt")]

    def pick(self) -> str:
        if not (self.cli.store / "data.mdb").exists():
            return "run"
        unfinished = self.unfinished()
        resumable = [r for r in unfinished if r.state == "live" or r.fork_of]
        weights = {
            "run": 3.0 if len(unfinished) < MAX_UNFINISHED else 0.5,
            "resume": 4.0 if resumable else 0.0,
            "worker": 1.5,
            "gc": 1.0,
            "compact": 0.8,
            "fork": 1.0 if len(unfinished) < MAX_UNFINISHED + 2 else 0.0,
            "overlap": 0.8 if resumable else 0.0,
        }
        return self.rng.choices(list(weights), list(weights.values()))[0]

    def run_delay(self) -> float:
        if self.rng.random() < 0.15:  # now and then long enough to finish, or to die after the last commit
            return self.rng.uniform(RUN_HORIZON, 2.5 * RUN_HORIZON)
        return self.rng.uniform(0.02, RUN_HORIZON)

    def delay(self, action: str) -> float:
        return self.rng.uniform(0.02, max(0.1, 1.25 * self.horizon[action]))

    def learn(self, attempt: Attempt) -> None:
        """Track the natural duration of an unkilled short command (its kill horizon)."""
        if not attempt.killed and attempt.action in self.horizon and attempt.code == 0:
            self.horizon[attempt.action] = 0.8 * self.horizon[attempt.action] + 0.2 * attempt.duration

    def new_run(self, fork_of: str | None = None) -> Run:
        self.made += 1
        run = Run(f"{self.tag}{'f' if fork_of else 'r'}{self.made}", fork_of=fork_of)
        self.runs[run.run_id] = run
        return run

    def run_target(self) -> Run:
        doubtful = [r for r in self.runs.values() if r.state == "doubt" and not r.fork_of]
        if doubtful and self.rng.random() < 0.6:
            return self.rng.choice(doubtful)
        if len(self.unfinished()) < MAX_UNFINISHED:
            return self.new_run()
        return self.rng.choice(self.unfinished())

    def start_drive(self, run: Run, delay: float | None, action: str, steal: bool = False) -> Attempt:
        if steal:
            args: tuple[str, ...] = ("resume", "--json", "--steal", run.run_id)
        elif run.fork_of or (run.state == "live" and action != "run"):
            args = ("resume", "--json", run.run_id)
        else:
            args = ("run", "--json", "--run-id", run.run_id, LEDGER_AGENT)
        return Attempt(self.cli, action, args, delay)

    def start_worker(self, delay: float | None, whole_group: bool) -> Attempt:
        return Attempt(self.cli, "worker", ("worker", "--once", "--concurrency", "2", "--poll", "0.05"),
                       delay, whole_group)

    def act(self, action: str) -> None:
        self.fig.actions += 1
        landed = 0
        if action in ("run", "resume"):
            if action == "run":
                run = self.run_target()
            else:
                run = self.rng.choice([r for r in self.unfinished() if r.state == "live" or r.fork_of])
            attempt = self.start_drive(run, self.run_delay(), action)
            supervise([attempt])
            landed = self.judge_drive(attempt, run)
        elif action == "worker":
            at_risk = self.unfinished()
            whole = self.rng.random() < 2 / 3
            attempt = self.start_worker(self.delay("worker"), whole)
            supervise([attempt])
            landed = self.judge_worker(attempt, at_risk)
        elif action in ("gc", "compact"):
            args = ("gc", "--json", "--compact") if action == "compact" else ("gc", "--json")
            attempt = Attempt(self.cli, action, args, self.delay(action))
            supervise([attempt])
            landed = self.judge_gc(attempt)
        elif action == "fork":
            parents = [r for r in self.runs.values() if r.state in ("live", "done")]
            if not parents:
                return
            parent = self.rng.choice(parents)
            child = self.new_run(fork_of=parent.run_id)
            attempt = Attempt(self.cli, "fork", ("fork", "--json", "--run-id", child.run_id, parent.run_id),
                              self.delay("fork"))
            supervise([attempt])
            landed = self.judge_fork(attempt, child)
        else:  # overlap: a worker and a manual resume at once
            run = self.rng.choice([r for r in self.unfinished() if r.state == "live" or r.fork_of])
            at_risk = self.unfinished()
            worker = self.start_worker(self.delay("worker"), True)
            manual = self.start_drive(run, self.run_delay(), "resume")
            supervise([worker, manual])
            landed = self.judge_worker(worker, at_risk) + self.judge_drive(manual, run)
        self.fig.kills += landed
        self.fig.by_action[action] += landed

    # -- judging what a command did

    def judge_common(self, attempt: Attempt) -> bool:
        """Generic failures: a hang, a traceback, an internal error.  True if the attempt is sane."""
        self.learn(attempt)
        if attempt.hung:
            self.problem(f"HANG: {attempt.describe()}")
            return False
        if "Traceback" in attempt.err or "internal error" in attempt.err:
            self.problem(attempt.describe())
            return False
        return True

    def judge_drive(self, attempt: Attempt, run: Run) -> int:
        if not self.judge_common(attempt):
            return int(attempt.landed)
        err = attempt.err
        if attempt.landed:
            run.kills += 1
            # `tcc run` prints "run R" once R is created, "resuming R" once it found R
            if attempt.args[0] == "run" and any(
                    ln.strip() in (f"run {run.run_id}", f"resuming {run.run_id}") for ln in err.splitlines()):
                run.state = "live" if run.state != "done" else "done"
            return 1
        if attempt.code == 0:
            doc = attempt.json_out() or {}
            if doc.get("status") == "completed" and doc.get("result") == EXPECTED:
                run.state = "done"
            else:
                self.problem(f"run {run.run_id} ended {doc}: {attempt.describe()}")
        elif attempt.code in (1, 2) and ("already completed" in err or "is completed" in err):
            run.state = "done"  # 2: seen before claiming; 1: lost the claim to whoever finished it
        elif attempt.code == 1 and "no run '" in err:
            run.state = "absent" if run.fork_of else "doubt"
        elif attempt.code == 1 and "owned by" in err:
            self.fig.refused += 1
            if run.state == "doubt" and not run.fork_of:
                run.state = "live"
        elif attempt.code == -signal.SIGKILL:
            pass  # killed by our SIGKILL a hair after poll() said it had exited
        else:
            self.problem(attempt.describe())
        return 0

    def judge_worker(self, attempt: Attempt, at_risk: list[Run]) -> int:
        if not self.judge_common(attempt):
            return int(attempt.landed)
        for line in attempt.err.splitlines():
            words = line.split()  # "worker: run R exited with N"
            if len(words) == 6 and words[:2] == ["worker:", "run"] and words[3:5] == ["exited", "with"]:
                run = self.runs.get(words[2])
                if words[5] == "0" and run is not None:
                    run.state = "done"
                elif words[5] != str(-signal.SIGKILL):
                    self.fig.worker_child_failures += 1
        if attempt.landed:
            if attempt.whole_group:
                for run in at_risk:
                    run.kills += 1
            else:
                self.orphans.append(attempt.proc.pid)
            return 1
        if attempt.code not in (0, -signal.SIGKILL):
            self.problem(attempt.describe())
        return 0

    def judge_gc(self, attempt: Attempt) -> int:
        if not self.judge_common(attempt):
            return int(attempt.landed)
        if attempt.landed:
            return 1
        if attempt.code == 1 and attempt.action == "compact" and "open in another process" in attempt.err:
            self.fig.refused += 1
            if not self.orphans:
                self.problem(f"compaction refused with no other process alive: {attempt.describe()}")
        elif attempt.code not in (0, -signal.SIGKILL):
            self.problem(attempt.describe())
        return 0

    def judge_fork(self, attempt: Attempt, child: Run) -> int:
        if not self.judge_common(attempt):
            child.state = "doubt"
            return int(attempt.landed)
        if attempt.landed:
            return 1  # the fork may or may not exist: state stays "doubt"
        doc = attempt.json_out()
        if attempt.code == 0 and doc == {"id": child.run_id, "parent": child.fork_of}:
            child.state = "live"
            self.fig.forks += 1
        elif attempt.code in (1, 2) and ("has no snapshot" in attempt.err):  # 2: usage error
            child.state = "absent"
        elif attempt.code == -signal.SIGKILL:
            pass
        else:
            self.problem(attempt.describe())
        return 0

    # -- finishing and checking a store

    def listed(self) -> dict[str, str]:
        ls = Attempt(self.cli, "ls", ("ls", "--json"), None)
        ls.collect()
        if (ls.code != 0 and "no tcc store at" in ls.err and not (self.cli.store / "data.mdb").exists()
                and all(r.state == "doubt" for r in self.runs.values())):
            # every `tcc run` was killed before it created the store (likely when a store
            # takes only a few kills); the runs in doubt are run below, creating it
            return {}
        if ls.code != 0:
            self.problem(f"the store does not list: {ls.describe()}")
            return {}
        return {r["id"]: r["status"] for r in json.loads(ls.out)}

    def finish(self) -> None:
        """Let orphans end, then drive every run and fork to completion without kills."""
        deadline = time.monotonic() + FINISH_TIMEOUT
        while self.orphans and time.monotonic() < deadline:
            self.orphans = [g for g in self.orphans if reap_group(g, block=False)]
            time.sleep(0.05)
        if self.orphans:
            self.problem(f"HANG: orphaned resumes of a killed worker still alive after {FINISH_TIMEOUT} s")
            for pgid in self.orphans:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, signal.SIGKILL)
            return
        listed = self.listed()
        for run_id in set(listed) - set(self.runs):
            self.problem(f"`tcc ls` lists a run the campaign never made: {run_id}")
        for run in self.runs.values():
            if run.run_id in listed:
                continue
            if run.state in ("live", "done"):
                self.problem(f"run {run.run_id} ({run.state}) vanished from `tcc ls`")
            run.state = "absent" if run.fork_of else "doubt"  # never created: (re)run it below
        for run in self.runs.values():
            if listed.get(run.run_id) == "completed":
                run.state = "done"
            if run.state in ("done", "absent") or self.stop.is_set():
                continue
            for tries in range(3):
                # a retry steals: a stale owner (a reused pid) is the only reason for a refusal now
                attempt = self.start_drive(run, None, "finish", steal=tries > 0)
                attempt.collect()
                self.judge_drive(attempt, run)
                if run.state in ("done", "absent") or "owned by" not in attempt.err:
                    break
                self.fig.steals += 1
            if run.state not in ("done", "absent"):
                self.problem(f"run {run.run_id} does not finish: {attempt.describe()}")
        listed = self.listed()
        for run in self.runs.values():
            if run.state != "absent" and listed.get(run.run_id) != "completed":
                self.problem(f"run {run.run_id} is {listed.get(run.run_id)} after finishing")
        for args in (("gc", "--json"), ("gc", "--json", "--compact")):
            gc = Attempt(self.cli, "final-gc", args, None)
            gc.collect()
            if gc.code != 0 or "Traceback" in gc.err:
                self.problem(f"after the campaign: {gc.describe()}")
        stale = sorted(p.name for p in self.cli.store.glob("compact.*"))
        self.fig.stale_compact_dirs += len(stale)
        if stale:
            self.problem(f"a finished `tcc gc --compact` left {stale} behind")

    def check(self) -> None:
        """Every run and fork: completed, exact, nothing lost, duplicates bounded, forks contained."""
        try:
            docs = read_store(self.cli.store)
        except Exception as exc:  # noqa: BLE001 - reported as a finding, with its type
            self.problem(f"the store does not open after the campaign: {type(exc).__name__}: {exc}")
            return
        ledger, torn = ledger_lines(self.ledger)
        for line in torn:
            self.problem(f"torn ledger line {line!r}")
        own: dict[str, dict[str, int]] = {}  # run -> its own completed calls (key -> value)
        every: dict[str, dict[str, int]] = {}  # run -> all its completed calls, inherited ones too
        for run_id, doc in docs.items():
            calls = doc["calls"]
            every[run_id] = {k: o[1] for k, o in calls if o is not None and o[0] == "send"}
            own[run_id] = {k: v for k, v in every[run_id].items() if k.rpartition(":")[0] == run_id}
        for run_id, doc in docs.items():
            self.fig.runs += 1
            run = self.runs.get(run_id, Run(run_id))
            if self.check_run(run, doc, every, own, ledger):
                self.fig.completed_exactly += 1
        for key, values in ledger.items():  # every line belongs to a call its own run completed
            owner = key.rpartition(":")[0]
            if key not in own.get(owner, {}):
                self.problem(f"ledger line {key} {values} is not a call that run {owner!r} completed "
                             "(a fork writing under another run's key, or a lost acknowledgement)")

    def check_run(self, run: Run, doc: dict[str, Any], every: dict[str, dict[str, int]],
                  own: dict[str, dict[str, int]], ledger: dict[str, list[str]]) -> bool:
        rid = run.run_id
        bad = len(self.fig.problems)
        if doc["status"] != "completed" or doc["result"] != EXPECTED:
            self.problem(f"run {rid} is {doc['status']} with result {doc['result']}")
        calls = doc["calls"]
        if len(calls) != STEPS or any(o is None or o[0] != "send" for _k, o in calls):
            self.problem(f"run {rid}: journal has {len(calls)} calls, not {STEPS} completed ones: "
                         f"{[(k, o) for k, o in calls if o is None or o[0] != 'send'][:3]}")
        inherited = True
        for n, (key, outcome) in enumerate(calls, start=1):
            owner, _, step = key.rpartition(":")
            if step != str(n):
                self.problem(f"run {rid}: call {n} has key {key}")
                continue
            if owner == rid:
                inherited = False
            elif not inherited or run.fork_of is None:
                self.problem(f"run {rid}: call {key} belongs to another run")
            elif every.get(run.fork_of, {}).get(key) != (outcome[1] if outcome else None):
                self.problem(f"run {rid}: inherited call {key} differs from its parent {run.fork_of}'s")
            if outcome is None or outcome[0] != "send":
                continue
            value = outcome[1]
            if value // 1000 != n - 1:
                self.problem(f"run {rid}: call {key} returned {value}")
            if owner != rid:
                continue
            seen = ledger.get(key, [])
            if not seen:
                self.fig.lost_steps += 1
                self.problem(f"LOST: run {rid} journaled {key} = {value} but the ledger has no line for it")
            elif any(int(v) != value for v in seen):
                self.problem(f"run {rid}: {key} journaled {value}, ledger has {seen} (different arguments)")
        duplicates = sum(len(ledger.get(key, [])) - 1 for key in own.get(rid, {}) if ledger.get(key))
        self.fig.duplicates += duplicates
        self.fig.in_doubt += doc["in_doubt"]
        limit = 0 if self.verify else run.kills
        if duplicates > limit:
            self.problem(f"run {rid}: {duplicates} duplicate effects but {run.kills} kills"
                         f"{' and a verify probe' if self.verify else ''}")
        if doc["in_doubt"] > run.kills:
            self.problem(f"run {rid}: {doc['in_doubt']} in-doubt re-issues but only {run.kills} kills")
        return len(self.fig.problems) == bad


# ------------------------------------------------------------ the campaign


@pytest.fixture
def reaper() -> Iterator[None]:
    """Adopt orphans for the test; kill and reap whatever is left when it ends (or times out)."""
    adopted = set_subreaper(True)
    try:
        yield
    finally:
        with LIVE_LOCK:
            left = list(LIVE)
            LIVE.clear()
        for proc in left:
            kill_group(proc)
            proc.communicate()
            reap_group(proc.pid, block=True)
        if adopted:
            with contextlib.suppress(ChildProcessError):
                while os.waitpid(-1, os.WNOHANG)[0]:
                    pass
            set_subreaper(False)


def campaign(tmp_path: pathlib.Path, kills: int, seed: int, *, verify: bool, tier: str) -> Figures:
    """Spread ``kills`` over JOBS threads, each campaigning on its own stores; print the summary."""
    stop = threading.Event()
    total = Figures()
    shares = [kills // JOBS + (1 if j < kills % JOBS else 0) for j in range(JOBS)]
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(JOBS) as pool:
        futures = [pool.submit(Job(tmp_path, j, seed, verify, stop).campaign, share)
                   for j, share in enumerate(shares) if share]
        try:
            for future in futures:
                total.add(future.result())
        except BaseException:  # a timeout or a failed job: stop the others' processes now
            stop.set()
            with LIVE_LOCK:
                left = list(LIVE)
            for proc in left:
                kill_group(proc)
            raise
        finally:
            stop.set()
    seconds = time.monotonic() - t0
    by_action = "/".join(f"{a}:{total.by_action[a]}" for a in ACTIONS)
    print(f"\nkills={total.kills} runs={total.runs} completed_exactly={total.completed_exactly} "
          f"lost_steps={total.lost_steps} duplicates={total.duplicates} in_doubt={total.in_doubt} "
          f"forks={total.forks} by_action={by_action} refused={total.refused} steals={total.steals} "
          f"worker_child_failures={total.worker_child_failures} "
          f"stale_compact_dirs={total.stale_compact_dirs} "
          f"actions={total.actions} stores={total.stores} jobs={JOBS} seconds={seconds:.1f} "
          f"kills_per_s={total.kills / max(seconds, 1e-9):.2f} "
          f"(mixed campaign, {tier} tier, verify={int(verify)}, seed={seed})")
    return total


def assert_campaign(fig: Figures, kills: int, *, verify: bool) -> None:
    assert not fig.problems, f"{len(fig.problems)} problems:\n" + "\n".join(fig.problems[:20])
    assert fig.kills >= kills
    assert fig.runs == fig.completed_exactly > 0
    assert fig.lost_steps == 0
    if verify:
        assert fig.duplicates == 0


@pytest.mark.timeout(300)
def test_mixed_kill_campaign_loses_nothing(tmp_path, reaper):
    """SIGKILLs across run/resume/worker/gc/compact/fork: every run exact, nothing lost, dups <= kills."""
    fig = campaign(tmp_path, KILLS, SEED, verify=False, tier="ci")
    assert_campaign(fig, KILLS, verify=False)


@pytest.mark.timeout(300)
def test_mixed_kill_campaign_with_verify_probe_has_no_duplicates(tmp_path, reaper):
    """The same campaign with a verify probe on every effect: zero duplicates."""
    fig = campaign(tmp_path, KILLS, SEED + 1, verify=True, tier="ci")
    assert_campaign(fig, KILLS, verify=True)


def encrypted_campaign(tmp_path: pathlib.Path, kills: int, seed: int, tier: str) -> Figures:
    """The campaign with a store key in the environment: every store it makes (and every
    `tcc` process it starts) is encrypted; checked on each store's format header."""
    with store_key_in_environment(tmp_path):
        fig = campaign(tmp_path / "campaign", kills, seed, verify=False, tier=f"{tier} encrypted")
    stores = sorted((tmp_path / "campaign").glob("j*s*/store"))
    assert stores and all(is_encrypted_store(s) for s in stores), stores
    return fig


@pytest.mark.timeout(300)
def test_mixed_kill_campaign_on_encrypted_stores_loses_nothing(tmp_path, reaper):
    """The mixed SIGKILL campaign on encrypted stores: every run exact, nothing lost, dups <= kills."""
    fig = encrypted_campaign(tmp_path, ENCRYPTED_KILLS, SEED + 5, "ci")
    assert_campaign(fig, ENCRYPTED_KILLS, verify=False)


@pytest.mark.slow
@pytest.mark.timeout(max(3600, 2 * SLOW_ENCRYPTED_KILLS))
def test_large_mixed_kill_campaign_on_encrypted_stores(tmp_path, reaper):
    """Slow tier: TCC_SLOW_CAMPAIGN_ENCRYPTED_KILLS [2000] kills on encrypted stores, same guarantees."""
    fig = encrypted_campaign(tmp_path, SLOW_ENCRYPTED_KILLS, SEED + 6, "slow")
    assert_campaign(fig, SLOW_ENCRYPTED_KILLS, verify=False)


@pytest.mark.slow
@pytest.mark.timeout(max(3600, 2 * SLOW_KILLS))
def test_large_mixed_kill_campaign(tmp_path, reaper):
    """Slow tier: TCC_SLOW_CAMPAIGN_KILLS [10000] kills, same guarantees."""
    fig = campaign(tmp_path, SLOW_KILLS, SEED + 2, verify=False, tier="slow")
    assert_campaign(fig, SLOW_KILLS, verify=False)


@pytest.mark.slow
@pytest.mark.timeout(max(3600, 2 * SLOW_VERIFY_KILLS))
def test_large_mixed_kill_campaign_with_verify_probe(tmp_path, reaper):
    """Slow tier with verify probes: TCC_SLOW_CAMPAIGN_VERIFY_KILLS [2000] kills, zero duplicates."""
    fig = campaign(tmp_path, SLOW_VERIFY_KILLS, SEED + 3, verify=True, tier="slow")
    assert_campaign(fig, SLOW_VERIFY_KILLS, verify=True)


def test_fork_of_a_run_without_a_snapshot_is_a_clear_error(tmp_path):
    """Forking a run that was killed inside its first effect fails with one clear `tcc: error:` line.

    Regression (found by the campaign): fork_run packed snapshot number -1 into
    a key before checking it, so this was "internal error (struct.error ...)".
    """
    cli = Cli(tmp_path, LEDGER=str(tmp_path / "ledger.txt"), DIE_AT="0")
    died = cli.run("run", "--run-id", "early", LEDGER_AGENT)
    assert died.returncode == -signal.SIGKILL
    proc = Cli(tmp_path, LEDGER=str(tmp_path / "ledger.txt")).run("fork", "early", "--run-id", "f")
    assert proc.returncode == 2, proc.stderr  # a usage error, as `tcc inspect` reports it
    assert proc.stderr.startswith("tcc: error:") and "internal error" not in proc.stderr, proc.stderr
    assert "snapshot" in proc.stderr


COMPACT_DIES = """
import os, signal, sys
from tcc.store import open_store
os.replace = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)  # SIGKILLed just before the swap
with open_store(sys.argv[1], create=False) as store:
    store.compact()
"""


def test_killed_compaction_leaves_no_copy_behind(tmp_path):
    """A compaction killed before its swap leaves no compact.* copy once the next `tcc gc --compact` ran.

    Regression (found by the campaign): each compaction removed only its own
    pid's directory, so a killed one's copy of data.mdb stayed forever.
    """
    cli = Cli(tmp_path, LEDGER=str(tmp_path / "ledger.txt"), STEPS="5")
    cli.run("run", LEDGER_AGENT, check=True)
    died = subprocess.run([sys.executable, "-c", COMPACT_DIES, str(cli.store)], env=cli.env,
                          capture_output=True, text=True, timeout=120)
    assert died.returncode == -signal.SIGKILL, died.stderr
    cli.run("gc", "--compact", check=True)
    assert sorted(p.name for p in cli.store.glob("compact.*")) == []
