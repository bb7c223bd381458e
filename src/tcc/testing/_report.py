"""What the crash-every-step checker found: :class:`RunOutcome`, :class:`StepResult`, :class:`Report`."""

from __future__ import annotations

import dataclasses
import json
from typing import Any


@dataclasses.dataclass(frozen=True)
class RunOutcome:
    """How a run ended, as compared by the checker.

    ``status`` is the run's (``completed``, ``failed``, ``unverified``,
    ``waiting``, ``sleeping``, ``cancelled``), or ``error`` when tcc itself
    refused or failed (then ``error`` is its message) or ``timeout``.  Run ids
    in ``result``, ``error`` and ``waiting_for`` are replaced by ``<run>``.
    """

    status: str
    result: Any = None
    error: str | None = None
    waiting_for: tuple[str, ...] = ()

    def __str__(self) -> str:
        from ..store import RETURNED_STATUSES

        if self.status in RETURNED_STATUSES and self.error is None:
            return f"{self.status} {json.dumps(self.result, sort_keys=True)}"
        if self.status == "waiting":
            return f"waiting for {', '.join(self.waiting_for) or '?'}"
        text = self.status if self.error is None else f"{self.status}: {self.error}"
        if self.result is not None:
            text += f" (result {json.dumps(self.result, sort_keys=True)})"
        return text


@dataclasses.dataclass
class StepResult:
    """One crash point: the ``step``-th journaled step of process ``segment`` (0: ``tcc run``,
    1: the first resume of a run that parked, ...)."""

    step: int
    segment: int
    run_id: str
    killed: bool = False            # the process died by SIGKILL at that step
    reached: bool = True            # False: that process ended before its step-th step
    outcome: RunOutcome | None = None
    processes: int = 0              # tcc processes the timeline took, the killed one included
    duplicates: list[str] = dataclasses.field(default_factory=list)
    problems: list[str] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def where(self) -> str:
        seg = f" of process {self.segment + 1}" if self.segment else ""
        return f"crash after step {self.step}{seg}"

    def __str__(self) -> str:
        if not self.ok:
            return f"{self.where}: FAILED: " + "; ".join(self.problems)
        if not self.reached:
            return f"{self.where}: not reached (that process had fewer steps) -> {self.outcome}"
        return f"{self.where}: ok (resumed to the same outcome; {self.processes} processes)"


@dataclasses.dataclass
class Report:
    """What :func:`check_crash_every_step` found."""

    script: str
    args: tuple[str, ...]
    strategy: str
    checkpoint_every: int | None
    expected: RunOutcome
    control: RunOutcome | None
    steps: int                      # N: journaled steps of the uninterrupted run
    segments: int                   # processes the uninterrupted run took (parks: > 1)
    results: list[StepResult]
    seconds: float

    @property
    def deterministic(self) -> bool:
        return self.control is None or self.control == self.expected

    @property
    def failures(self) -> list[StepResult]:
        return [r for r in self.results if not r.ok]

    @property
    def ok(self) -> bool:
        return self.deterministic and not self.failures

    def _title(self) -> str:
        every = f", checkpoint every {self.checkpoint_every}" if self.checkpoint_every else ""
        args = " ".join(self.args)
        return f"{self.script}{' ' + args if args else ''} (strategy {self.strategy}{every})"

    def __str__(self) -> str:
        lines = [f"crash-every-step check of {self._title()}: "
                 f"{'ok' if self.ok else 'MISMATCH'} in {self.seconds:.1f} s",
                 f"  uninterrupted: {self.expected} after {self.steps} steps"
                 + (f" in {self.segments} processes" if self.segments > 1 else "")]
        if self.expected.status == "waiting":
            lines.append("  (checked up to that wait only: nothing answers it, so no step after it "
                         "ran; answer it with approvals=/signals= to check the rest)")
        if not self.deterministic:
            lines.append(f"  NOT DETERMINISTIC: a second uninterrupted run gave {self.control}")
        lines += [f"  {r}" for r in self.results]
        return "\n".join(lines)

    def raise_for_mismatch(self) -> None:
        """Raise AssertionError naming each failing crash point and both outcomes."""
        if self.ok:
            return
        lines = [f"crash-every-step check of {self._title()} failed:"]
        if not self.deterministic:
            lines.append(
                f"  two uninterrupted runs differ: {self.expected} vs {self.control} -- the outcome "
                "depends on something other than the effects' results (time, randomness, the "
                "process), so crash points cannot be compared reliably")
        for r in self.failures:
            lines.append(f"  {r.where} (run {r.run_id}): " + "; ".join(r.problems))
        raise AssertionError("\n".join(lines))
