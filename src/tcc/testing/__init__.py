"""Testing agents: run one in-process without the runtime, and crash it at every step.

**In-process runs.**  Outside a run an effect is just its function, so a plain
``asyncio.run(main())`` breaks as soon as the agent awaits a *sync* effect (its
value is not awaitable) or calls ``tcc.gather``.  :func:`run` drives the agent
the way ``tcc run`` does, in this process, with no store, no journal and no
snapshots::

    import tcc.testing
    from my_agent import main, llm

    def test_agent():
        result = tcc.testing.run(main, "topic", signals={"note": "hi"}, approvals=True,
                                 fakes={llm: lambda prompt: "fake answer"})
        assert result["summary"] == "fake answer"

``run(func, *args, **kwargs)`` calls ``func`` (an ``async def``, a plain ``def``
entry as ``tcc run`` allows, or an already made coroutine) and returns its
result; an exception of the agent propagates.  ``run_script("agent.py[:func]",
*args)`` loads the script as ``tcc run`` does (under its stable module name;
its ``if __name__ == "__main__":`` block does not run) and runs its entry
function (``main`` by default).  ``await arun(...)`` is :func:`run` for code
that already runs in an event loop (an async test); ``run`` refuses to start
inside a running loop.  Keyword arguments other than the options below are
passed to ``func`` (so the agent cannot take parameters of those names this
way: make a coroutine with ``func(...)`` and pass that instead).

What each request does:

- an effect call runs the effect's function at once: an ``async def`` one on an
  event loop this call owns (with ``arun``: on the caller's loop), a sync one in
  this thread (with ``arun``: in a worker thread, as in a real run) in a copy
  of the current context.  ``tcc.current()`` inside it gives ``run_id`` and the
  same idempotency keys a fresh ``tcc run`` would use (``"test:1"``, ``"test:2"``,
  ...; ``"test:3.0"`` for the first call of a gather).  ``retries`` is honoured
  (each failed attempt is retried at once: ``retry_delay`` is not waited), and
  ``timeout`` bounds an async effect's attempt (cancelled, ``TimeoutError``); a
  sync effect runs without a timeout.  ``verify`` probes are never called
  (nothing is ever in doubt without a crash).  ``fakes={effect: fn}`` (keys:
  the effect, or its name) runs ``fn`` with the same arguments instead of the
  effect's function, with the effect's options.
- ``tcc.gather(...)``: the async calls run concurrently on the loop; the sync
  ones, with ``run``, one after the other in this thread first.  The result (or
  the first error, in call order) is what a real run gives.
- ``tcc.checkpoint()`` returns at once (there is nothing to snapshot).
- ``tcc.sleep`` / ``tcc.sleep_until`` return at once: no time passes.
- ``tcc.wait_for(name)`` returns ``signals[name]``; ``tcc.approval(prompt)``
  returns ``approvals`` (``True``/``False``, a list of them, one per approval in
  order, or a function ``prompt -> bool``).  ``sequence(v1, v2, ...)`` as a
  signal's value gives the first wait on that name ``v1``, the second ``v2``,
  and so on.  A wait with no answer raises :class:`MissingAnswerError` out of
  ``run`` (a ``tcc.errors.UsageError``) -- unless it has a ``timeout``: then
  ``TimeoutError`` is raised inside the agent, as when no signal comes in time.
- ``tcc.spawn(fn, *args)`` runs the child in-process, to the end, as a nested run
  with its own keys (run id ``"test.K"``), resolving ``fn`` by name in the module
  of the entry function like ``tcc run`` does in the script; a failed child raises
  ``RunFailedError("child run ... failed: ...")`` in the parent.  The options
  (signals, approvals, fakes) apply to children too.
- anything else the agent awaits (an asyncio future, ``asyncio.sleep(1)``) gets
  the ``TypeError`` a real run throws into the agent; a bare ``yield`` /
  ``asyncio.sleep(0)`` just continues.
- an effect call (or ``tcc.sleep`` ...) the agent makes and does not await
  before its next await raises ``tcc.errors.UnawaitedEffectError`` out of
  ``run``, the error a real run fails with.

Each attempt of an effect receives a fresh copy of its arguments, as in a real
run (so an effect that mutates an argument does not change the agent's object),
and arguments that a run could not journal raise ``CaptureError``.  The
script's ``verify(result)`` is not called, ``sys.exit()`` in the agent or an
effect propagates as ``SystemExit``, and no snapshot is taken: a local that
could not be captured, or state that does not survive a crash (a process id, a
file written outside an effect), is found by the crash checker below, not here.
With ``arun`` the agent is stepped inside the caller's running loop, so asyncio
APIs that fail inside a real run may seem to work there.

**Crash-every-step checker.**  :func:`check_crash_every_step` runs a script the
real way, ``python -m tcc run --json`` in subprocesses, each against a fresh
store in a temporary directory:

1. once uninterrupted, recording its outcome (status and result, or error) and
   its number N of journaled steps (effect calls, gathers, waits, sleeps and
   spawns: the highest call number among the idempotency keys of completed
   calls in the journals of the run and its children); a second uninterrupted run is a control: if the
   two differ, the outcome depends on something else than the effects (time,
   randomness, the process) and the report says so first;
2. then, for each k in 1..N, with ``TCC_TEST_KILL_AFTER=k``: the process SIGKILLs
   itself right after committing its k-th journaled step (a spawned child run
   counts its own steps, in the same process); the checker checks that it died
   by SIGKILL, resumes it with ``python -m tcc resume --json`` until it ends (a
   bounded number of times), and compares the outcome with the uninterrupted
   one.  It also reads every journal of the store (``tcc.store.open_store``,
   ``store.journal``): an idempotency key with more than one successful
   completion is an effect call that completed twice.

A run that parks waiting gets its answers from ``signals``/``approvals``
(delivered straight into the store at the wait's id, ``tcc resume`` follows);
a run that parks sleeping is resumed once its wake time has come, if that is
within ``timeout``.  Either way its later process segments are crash-tested as
well (the kill then hits the k-th step that *process* handled, which may be
past its end: such a k is reported as not reached, not as a failure).  A run
that still waits with no answer ends ``waiting``, and that is its outcome.

The kill lands between steps, after a commit, so this checks that resuming
from any committed state gives the same outcome with no call run twice; a crash
*inside* an effect (a call in flight, re-issued at least once) is the business
of its idempotency key and ``verify`` probe, and is not simulated here.

Results are compared as JSON after replacing the run's id with ``<run>``, so an
agent may put its run id or idempotency keys in the result.  Each crash point
gets its own run id (so an external service that deduplicates by idempotency
key sees distinct keys).  ``--strategy`` and ``--checkpoint-every`` are passed
through (``checkpoint_every=None``: tcc's default, 1, or 10 for hybrid).  Runs
use ``--durability none`` by default: a SIGKILL is a process crash, which loses
nothing acknowledged in any mode.  ``jobs`` crash points run at once.

From pytest::

    from tcc.testing import assert_crash_safe, check_crash_every_step

    def test_agent_survives_a_crash_at_every_step():
        assert_crash_safe("agent.py", "topic", strategy="continuation")

    def test_report():
        report = check_crash_every_step("agent.py:main", "topic", strategy="replay")
        print(report)               # one line per crash point
        report.raise_for_mismatch() # AssertionError naming each failing step

or from a shell: ``python -m tcc.testing [--strategy S] [--checkpoint-every K]
agent.py ARGS...`` (exit 1 on a mismatch).
"""

from ._answers import MissingAnswerError as MissingAnswerError
from ._answers import sequence as sequence
from ._checker import KILL_ENV as KILL_ENV
from ._checker import _scan_journals as _scan_journals  # checked on its own by tests/test_testing.py
from ._checker import assert_crash_safe as assert_crash_safe
from ._checker import check_crash_every_step as check_crash_every_step
from ._cli import main as main
from ._inprocess import arun as arun
from ._inprocess import run as run
from ._inprocess import run_script as run_script
from ._report import Report as Report
from ._report import RunOutcome as RunOutcome
from ._report import StepResult as StepResult

__all__ = [
    "KILL_ENV",
    "MissingAnswerError",
    "Report",
    "RunOutcome",
    "StepResult",
    "arun",
    "assert_crash_safe",
    "check_crash_every_step",
    "main",
    "run",
    "run_script",
    "sequence",
]

# The error a test sees prints (and pickles) as tcc.testing.MissingAnswerError, the name the
# docs give, whichever submodule defines it.
MissingAnswerError.__module__ = __name__
