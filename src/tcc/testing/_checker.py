"""The crash-every-step checker: run a script the real way (``python -m tcc run --json``) in
subprocesses, each against a fresh store, SIGKILL it after each journaled step, resume it,
and compare with an uninterrupted run.  How it works is in the ``tcc.testing`` docstring.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any, Collection, Mapping, Sequence

import tcc

from .. import errors
from ._answers import Answers, Approvals
from ._report import Report, RunOutcome, StepResult

# tcc.runtime and tcc.store are imported where they are needed, not here: importing
# tcc.testing costs no more than importing tcc.

KILL_ENV = "TCC_TEST_KILL_AFTER"  # the runtime driver's test hook: SIGKILL after the K-th journaled step
_TERMINAL = ("completed", "failed", "unverified", "cancelled", "error")
# the directory this tcc package is imported from
_IMPORT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(tcc.__file__)))


def _jsonish(value: Any, run_id: str) -> Any:
    """``value`` with ``run_id`` replaced by ``<run>`` in every string (keys too)."""
    if isinstance(value, str):
        return value.replace(run_id, "<run>")
    if isinstance(value, list):
        return [_jsonish(v, run_id) for v in value]
    if isinstance(value, dict):
        return {_jsonish(k, run_id): _jsonish(v, run_id) for k, v in value.items()}
    return value


def _parse(stdout: str) -> dict[str, Any] | None:
    """The ``--json`` document of ``tcc run``/``resume`` (the agent may print before it)."""
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if isinstance(doc, dict) and "status" in doc and "id" in doc:
                return doc
    return None


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


@dataclasses.dataclass
class _Timeline:
    outcome: RunOutcome
    processes: int = 0
    killed: bool | None = None      # None: no process was asked to die
    problems: list[str] = dataclasses.field(default_factory=list)
    duplicates: list[str] = dataclasses.field(default_factory=list)
    steps: int = 0                  # the highest call number in the store's journals


class _Checker:
    """Runs timelines of one script: ``tcc run``, then ``tcc resume`` until it ends."""

    def __init__(self, script: str, args: Sequence[str], strategy: str,
                 checkpoint_every: int | None, timeout: float, env: Mapping[str, str] | None,
                 answers: Answers, python: str, durability: str) -> None:
        self.script = script
        self.args = [str(a) for a in args]
        self.strategy = strategy
        self.checkpoint_every = checkpoint_every
        self.timeout = timeout
        self.answers = answers
        self.python = python
        self.durability = durability
        base = dict(os.environ)
        base.update(env or {})
        base.pop(KILL_ENV, None)
        base.pop("TCC_STORE", None)
        # the subprocesses import this very tcc, whether or not it is installed
        base["PYTHONPATH"] = os.pathsep.join(p for p in (_IMPORT_ROOT, base.get("PYTHONPATH")) if p)
        self.env = base
        # a bound on the processes of one timeline; after the uninterrupted run: its count,
        # plus the killed one, plus slack
        self.max_processes = 100

    def _tcc(self, store: str, argv: list[str], kill_after: int | None) -> subprocess.CompletedProcess[str]:
        env = self.env if kill_after is None else {**self.env, KILL_ENV: str(kill_after)}
        cmd = [self.python, "-m", "tcc", argv[0], "--json", "--store", store,
               "--durability", self.durability, *argv[1:]]
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=self.timeout,
                              stdin=subprocess.DEVNULL)

    def timeline(self, store: str, run_id: str, kill: tuple[int, int] | None) -> _Timeline:
        """Run ``run_id`` to its end in a fresh ``store``; ``kill=(segment, k)``: the
        segment-th process (0: ``tcc run``) gets ``TCC_TEST_KILL_AFTER=k``."""
        argv = ["run", "--run-id", run_id, "--strategy", self.strategy]
        if self.checkpoint_every is not None:
            argv += ["--checkpoint-every", str(self.checkpoint_every)]
        argv += [self.script, *self.args]
        resume = ["resume", run_id]
        line = _Timeline(RunOutcome("error", error="no process ran"))
        segment = 0  # processes that ran the agent without being killed by the hook
        while line.processes < self.max_processes:
            target = kill is not None and kill[0] == segment and line.killed is None
            try:
                proc = self._tcc(store, argv, kill[1] if target and kill is not None else None)
            except subprocess.TimeoutExpired:
                line.processes += 1
                line.outcome = RunOutcome("timeout", error=f"a tcc process ran over {self.timeout:g} s")
                line.problems.append(f"`tcc {argv[0]}` did not finish within {self.timeout:g} s")
                break
            line.processes += 1
            argv = resume
            if target:
                line.killed = proc.returncode == -signal.SIGKILL
                if line.killed:
                    continue
            if proc.returncode < 0:
                line.problems.append(
                    f"process {line.processes} died by signal {-proc.returncode} "
                    f"({_last_line(proc.stderr) or 'no message'})")
                continue
            segment += 1
            doc = _parse(proc.stdout)
            if doc is None:
                line.outcome = RunOutcome(
                    "error", error=_jsonish(_last_line(proc.stderr) or f"exit {proc.returncode}", run_id))
                break
            status = str(doc.get("status"))
            line.outcome = RunOutcome(status, _jsonish(doc.get("result"), run_id),
                                      _jsonish(doc.get("error"), run_id))
            if status in _TERMINAL:
                break
            if status == "stopped":
                continue
            blocked = self._unblock(store, run_id)
            if blocked is None:
                continue
            line.outcome = dataclasses.replace(line.outcome, waiting_for=blocked)
            break
        else:
            line.problems.append(f"the run had not ended after {self.max_processes} tcc processes "
                                 f"(last: {line.outcome})")
        self._read_journals(store, run_id, line)
        return line

    def _unblock(self, store_path: str, run_id: str) -> tuple[str, ...] | None:
        """Answer the waits of a parked run (and its children) and let due sleeps pass.

        None: something changed, resume; else the waits (or sleeps) that stay blocked.
        """
        from ..runtime import pending_waits
        from ..store import open_store

        blocked: list[str] = []
        progressed = False
        wake = 0.0
        with open_store(store_path, create=False, durability=self.durability) as store:
            for run in store.list_runs():
                if run.status == "waiting":
                    for wait in pending_waits(store, run.run_id):
                        wait_id = str(wait.get("id"))
                        if wait.get("signal") != "not sent":
                            continue
                        name, _, nth = wait_id.rpartition("@")
                        kind = str(wait.get("kind") or "signal")
                        found, value = self.answers.answer(kind, name, int(nth or 1), wait.get("prompt"))
                        if not found:
                            blocked.append(_jsonish(f"{run.run_id} {wait_id}", run_id))
                            continue
                        if kind == "approval":
                            raw = json.dumps({"approved": bool(value), "comment": None})
                        else:
                            raw = json.dumps(value)
                        store.send_signal(run.run_id, wait_id, raw.encode())
                        progressed = True
                elif run.status == "sleeping":
                    until = 0.0
                    for event in store.events(run.run_id):
                        data = dict(event.data)
                        if event.kind == "parked" and data.get("status") == "sleeping":
                            until = float(data.get("until") or 0.0)
                    if until - time.time() > self.timeout:
                        blocked.append(_jsonish(f"{run.run_id} sleep", run_id))
                    else:
                        wake = max(wake, until)
                        progressed = True
        if not progressed:  # nothing to answer or to wait for: it stays as it is
            return tuple(sorted(blocked)) or ("nothing this checker can answer",)
        if wake:
            time.sleep(max(0.0, wake - time.time()) + 0.05)
        return None

    def _read_journals(self, store_path: str, run_id: str, line: _Timeline) -> None:
        line.steps, duplicates = _scan_journals(store_path, self.durability)
        line.duplicates += [_jsonish(d, run_id) for d in duplicates]


def _scan_journals(store_path: str, durability: str = "none") -> tuple[int, list[str]]:
    """(steps, duplicates) of every run in the store: the highest call number of a completed
    step, and each effect call (idempotency key) with more than one successful completion."""
    from ..store import open_store

    steps = 0
    duplicates: list[str] = []
    try:
        with open_store(store_path, create=False, durability=durability) as store:
            for run in store.list_runs():
                records = store.journal(run.run_id)
                keys = {r.seq: (r.idempotency_key or f"seq:{r.seq}", r.name)
                        for r in records if r.kind == "intent"}
                done: dict[tuple[str, str], int] = {}
                for rec in records:
                    if rec.kind != "completion" or rec.intent_seq not in keys:
                        continue
                    key, name = keys[rec.intent_seq]
                    # A step counts once it completed: a wait or sleep that parked the run
                    # has an open intent, and the kill hook does not count it.
                    number = key.rpartition(":")[2].split(".")[0]
                    if number.isdigit():
                        steps = max(steps, int(number))
                    if rec.error is None:
                        done[key, name] = done.get((key, name), 0) + 1
                duplicates += [f"{name} ({key}) completed {count} times"
                               for (key, name), count in done.items() if count > 1]
    except errors.StoreNotFoundError:
        pass  # nothing was ever stored (e.g. tcc refused the script)
    return steps, duplicates


def check_crash_every_step(
    script: str,
    *args: Any,
    strategy: str = "continuation",
    checkpoint_every: int | None = None,
    timeout: float = 60.0,
    env: Mapping[str, str] | None = None,
    signals: Mapping[str, Any] | None = None,
    approvals: Approvals = None,
    steps: Collection[int] | None = None,
    jobs: int | None = None,
    durability: str = "none",
    python: str | None = None,
) -> Report:
    """Crash ``script`` (``path.py[:func]``) after each of its journaled steps and compare.

    ``timeout`` bounds each tcc process (seconds); ``env`` adds environment
    variables for every process; ``signals``/``approvals`` answer waits as in
    :func:`run` (values must be JSON); ``steps`` limits the crash points to
    these k; ``jobs`` crash points run at once (default: up to 4, the CPU
    count); ``python`` is the interpreter (default: this one).  Raises if the
    uninterrupted run does not produce an outcome (tcc refused the script, or
    the process died); a mismatch is in the report (``report.ok``,
    :meth:`Report.raise_for_mismatch`).  See the ``tcc.testing`` docstring.
    """
    from ..runtime import STRATEGIES

    if strategy not in STRATEGIES:
        raise errors.UsageError(f"unknown strategy {strategy!r}; choose continuation, hybrid or replay")
    if checkpoint_every is not None and checkpoint_every < 1:
        raise errors.UsageError("checkpoint_every must be >= 1")
    started = time.monotonic()
    checker = _Checker(script, [str(a) for a in args], strategy, checkpoint_every, timeout, env,
                       Answers(signals, approvals), python or sys.executable, durability)
    prefix = f"check-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory(prefix="tcc-check-") as work:
        ref = checker.timeline(os.path.join(work, "ref"), f"{prefix}-ref", None)
        if ref.outcome.status in ("error", "timeout") or ref.problems:
            raise errors.UsageError(
                f"the uninterrupted run of {script} gave no outcome to compare with: "
                f"{'; '.join(ref.problems) or ref.outcome}")
        segments = max(1, ref.processes)
        checker.max_processes = ref.processes + 6
        total = ref.steps
        if total == 0 and ref.outcome.status == "waiting":  # nothing to crash: it would pass
            raise errors.UsageError(
                f"the uninterrupted run of {script} made no journaled step before it stopped, "
                f"{ref.outcome}, which nothing answers: answer its waits (approvals=True or a "
                "dict, signals={...}; `python -m tcc.testing --approve yes` or `--signal "
                "NAME=JSON`), so there is no step to crash after and nothing would be checked")
        wanted = sorted(set(steps)) if steps is not None else list(range(1, total + 1))
        plan = [(seg, k) for seg in range(segments) for k in wanted]

        def crash(point: tuple[int, int]) -> StepResult:
            seg, k = point
            run_id = f"{prefix}-k{k}" if seg == 0 else f"{prefix}-s{seg}-k{k}"
            line = checker.timeline(os.path.join(work, f"s{seg}k{k}"), run_id, point)
            result = StepResult(k, seg, run_id, killed=bool(line.killed), outcome=line.outcome,
                                processes=line.processes, duplicates=line.duplicates,
                                problems=list(line.problems))
            if not line.killed:
                result.reached = False
                if segments == 1 and k <= total:
                    result.problems.append(
                        f"the run ended without a crash at step {k} (the uninterrupted run had "
                        f"{total} steps; got {line.outcome}): the steps differ between runs")
                return result
            if line.outcome != ref.outcome:
                result.problems.append(f"resumed outcome {line.outcome} != uninterrupted {ref.outcome}")
            result.problems += [f"duplicate: {d}" for d in line.duplicates]
            return result

        def control(_: Any) -> _Timeline:
            return checker.timeline(os.path.join(work, "control"), f"{prefix}-control", None)

        workers = max(1, jobs if jobs is not None else min(4, os.cpu_count() or 1))
        with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
            controlled = pool.submit(control, None)
            results = list(pool.map(crash, plan))
            second = controlled.result()
    return Report(script, tuple(str(a) for a in args), strategy, checkpoint_every, ref.outcome,
                  second.outcome, total, segments, results, time.monotonic() - started)


def assert_crash_safe(script: str, *args: Any, **options: Any) -> Report:
    """:func:`check_crash_every_step`, then raise AssertionError on any mismatch; returns
    the report.  For pytest: ``tcc.testing.assert_crash_safe("agent.py", "topic")``."""
    report = check_crash_every_step(script, *args, **options)
    report.raise_for_mismatch()
    return report
