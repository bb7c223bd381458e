"""Start and resume runs: the glue between scripts, snapshots and the driver."""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import time
from typing import Any, Callable, Sequence

from .. import errors
from ..capture import load_payload, native_available, process_modules, set_process_modules, unseal
from ..store import (FINAL_STATUSES, FINISHED_STATUSES, HOST, PARKED_STATUSES, RETURNED_STATUSES, RunInfo,
                     Store)
from . import _scripts
from ._process_state import process_state_notes
from ._globals import ModuleState
from ..effects import EffectRequest
from ._driver import Driver, Outcome
from ._journal import LoggedCall, answered_request, logged_calls
from ._markers import SLEEP_EFFECT, SPAWN_EFFECT, WAIT_EFFECT, executed as _executed, read_wait_args
from ._outcome import decode_child
from ._parking import Parked
from ._pinning import (CODE_MODES, CODE_POLICIES, DEFAULT_POLICY, CodeRecorder, Manifest, PinnedCode,
                       awaiting_decision, changed_files, manifest_of, policy_of, project_root)
from ._state import Resumption, unpack_state

STRATEGIES = ("continuation", "replay", "hybrid")


def parse_strategy(stored: str) -> tuple[str, int]:
    """``"hybrid:50"`` -> ("hybrid", 50); others have a snapshot interval of 1."""
    name, _, every = stored.partition(":")
    return name, int(every) if every else 1


def strategy_label(strategy: str, snapshot_every: int) -> str:
    """What is stored with the run: continuation, replay or hybrid:K."""
    if strategy == "continuation" and snapshot_every > 1:
        strategy = "hybrid"
    return f"hybrid:{snapshot_every}" if strategy == "hybrid" else strategy
Progress = Callable[[str, Driver], None]

REPLAY_HINT = (
    "replay re-executes the run from the start under the current code and serves each "
    "journaled answer to its call, so it works only if the code still makes the same calls "
    "with the same arguments, in the same order, up to the end of the journal; where it "
    "does not, it stops with ReplayDivergenceError naming the call:"
)


def _entry(target: str | Callable[..., Any]) -> str:
    """The stored entry of a ``tcc run`` target (``path[:func]``) or a function object."""
    if not isinstance(target, str):
        return _scripts.entry_of(target)
    path, func = _scripts.split_entry(target)
    return f"{path}:{func}"


def is_sync(func: Any) -> bool:
    return not inspect.iscoroutinefunction(func)


def check_call(func: Any, args: Sequence[str], entry: str) -> None:
    """Usage errors of calling the entry ``func(*args)``, raised before anything is stored.

    A call that failed only once the run record existed would leave a run in status
    ``running`` that the worker retries for ever.
    """
    if inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func):
        raise errors.UsageError(
            f"{entry} is a generator function: the entry must be an `async def` or a plain "
            "`def` function")
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):  # no signature to check (a builtin): the call will tell
        return
    try:
        sig.bind(*args)
    except TypeError as exc:
        raise errors.UsageError(
            f"{entry} cannot be called with the arguments {list(args)!r}: {exc} (everything "
            "after SCRIPT is passed to the agent, so tcc options go before SCRIPT)") from None


def _make_coroutine(func: Any, args: Sequence[str], entry: str, run_id: str, tenant: str = "default") -> Any:
    if inspect.iscoroutinefunction(func):
        return func(*args)
    if inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func):
        raise errors.UsageError(f"{entry} must be an `async def` or a plain `def` function")
    from ._sync import GreenletTask

    return GreenletTask(func, tuple(args), run_id, tenant)


SYNC_NOTICE = (
    "main is a plain function: sync frames cannot be captured, so this run is journaled and "
    "recovers by replaying the journal (strategy replay)"
)


def effective_strategy(strategy: str) -> tuple[str, str | None]:
    """The strategy to use here, and a notice if it had to change."""
    strategy = parse_strategy(strategy)[0]
    if strategy not in STRATEGIES:
        raise errors.UsageError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    if strategy in ("continuation", "hybrid") and not native_available():
        return "replay", (
            "tcc._native is not available on this interpreter: the run is journaled and will "
            "recover by replaying the journal instead of resuming a snapshot"
        )
    return strategy, None


def _verify_func(entry: str, verify: str | None, pinned: PinnedCode | None = None) -> Any:
    """The run's verify check: ``--verify FUNC``, else the script's ``verify`` if any."""
    module = pinned.entry_module(entry) if pinned is not None else _scripts.entry_module(entry)
    if verify:
        func = getattr(module, verify, None)
        if not callable(func):
            raise errors.UsageError(
                f"{_scripts.describe_entry(entry)} has no function {verify!r} to verify results with")
        return func
    func = getattr(module, "verify", None)
    return func if callable(func) else None


def _entry_function(entry: str, pinned: PinnedCode) -> Any:
    """The run's entry function, from its pinned module if the run's code is pinned."""
    module = pinned.entry_module(entry)
    func_name = entry.rpartition(":")[2] if _scripts.is_module_entry(entry) else _scripts.split_entry(entry)[1]
    func = getattr(module, func_name, None)
    if func is None or not callable(func):
        raise errors.UsageError(f"{_scripts.describe_entry(entry)} has no function {func_name!r}")
    if isinstance(func, type):
        raise errors.UsageError(
            f"{_scripts.describe_entry(entry)}: {func_name!r} is a class, not a function; give a "
            "module-level function that makes and runs it")
    return func


def _code_mode(store: Store, run: RunInfo, strategy: str, code: str | None,
               on_notice: Callable[[str], None] | None, claimed_epoch: int | None = None,
               retrying: bool = False) -> tuple[str, Manifest | None, bool, int | None]:
    """``code``, or what the run's policy makes of a change of its files: ``pinned``
    (continue on the recorded code), ``current`` (refuse a changed frame; or, under the
    ``upgrade`` policy, after moving the run onto the current code); the run's manifest if
    it was read (None: read it when needed); and whether the run is to be upgraded once it
    has taken its next snapshot on its recorded code (the upgrade policy, and a call in
    flight at a crash after the newest snapshot, which belongs to the old code's frame); and
    the epoch to claim the run at (``claimed_epoch``; None once the upgrade, in this process,
    has claimed it)."""
    if code is not None and code != "upgrade":
        return code, None, False, claimed_epoch
    if strategy == "replay":
        return "current", None, False, claimed_epoch
    events = store.events(run.run_id)
    policy, manifest = policy_of(events), manifest_of(events)
    if code == "upgrade":  # for this resume, whatever the run's policy
        policy = "upgrade"
    if not manifest:
        return "current", manifest, False, claimed_epoch
    if policy == "refuse":
        # any change, in a suspended frame or not, waits for a person; a run already on its
        # recorded code (a fork taken on it after an edit, a decision made before) stays on it
        changed = awaiting_decision(events)
        if changed:
            verb = "retry" if retrying else "resume"
            raise errors.CodeChangedError(
                f"run {run.run_id}: its code changed since it recorded it "
                f"({', '.join(_scripts.script_display_name(n) for n in changed)}) and its policy "
                f"is refuse, so it waits for a decision: `tcc {verb} --code pinned {run.run_id}` "
                f"continues it on the code it recorded, `tcc {verb} --code current "
                f"{run.run_id}` on the current code (refused where a suspended frame's code "
                f"changed), `tcc upgrade {run.run_id}` moves it onto the current code")
        return "current", manifest, False, claimed_epoch
    if policy == "pinned" or not changed_files(manifest):
        return "pinned", manifest, False, claimed_epoch
    from ._upgrade import upgrade  # the upgrade policy: move the run first

    plan = upgrade(store, run.run_id, expect_epoch=claimed_epoch, keep_claim=True)
    if not plan.ok and plan.after_snapshot:
        frames = upgrade(store, run.run_id, dry_run=True, ignore_tail=True)  # are they mappable?
        if not frames.ok:
            plan = frames
        else:
            if on_notice is not None:
                on_notice(f"run {run.run_id} continues on the code it recorded until its next snapshot "
                          "(a call after its newest snapshot belongs to that code), then moves onto "
                          "the current code (its policy is --on-code-change upgrade)")
            return "pinned", manifest, True, claimed_epoch
    if not plan.ok:
        raise errors.CodeChangedError(
            f"run {run.run_id}: its code changed and its policy is to upgrade it, but the "
            "upgrade is refused: " + "; ".join(plan.all_refusals())
            + f" (`tcc resume --code pinned {run.run_id}` continues it on the code it recorded)")
    if on_notice is not None:
        on_notice(f"run {run.run_id} was upgraded onto the current code (snapshot {plan.written}; "
                  "its policy is --on-code-change upgrade)")
    return "current", None, False, None  # (the upgrade recorded the current code, and claimed it)


def _check_pinnable(run: RunInfo, strategy: str, pinned: PinnedCode) -> None:
    """``--code pinned`` needs a snapshot strategy and recorded code."""
    if strategy == "replay":
        raise errors.UsageError(
            f"run {run.run_id}: --code pinned continues a run from its snapshot on the code it "
            "recorded; the replay strategy re-executes the current code from the start")
    if not pinned.manifest:
        raise errors.UsageError(
            f"run {run.run_id} has no recorded code: it took no snapshot yet, or a tcc older "
            "than pinned code took them (resume it on the current code, or with --strategy replay)")


def _restore_hint(run_id: str, exc: Exception, code: str, manifest: Manifest) -> str:
    """What to do about a snapshot that cannot be restored (a code change, mostly)."""
    replay = f"{REPLAY_HINT} `tcc resume --strategy replay {run_id}`"
    if not isinstance(exc, errors.CodeChangedError):
        return replay
    if code == "pinned":
        roots = sorted({os.path.dirname(e["file"]) for e in manifest.values()})
        return ("the pinned code holds the modules of the project only (" + ", ".join(roots)
                + "); the changed function lives outside it, in a library or another folder, "
                "which tcc never pins: install the version the run started with; " + replay)
    if manifest:
        return (f"`tcc resume --code pinned {run_id}` continues the run on the code it "
                f"recorded; {replay}")
    return replay


def _history(store: Store, run_id: str, epoch: int
             ) -> tuple[str | None, bool, set[tuple[str, int]], Manifest]:
    """From the run's events: its ``--verify`` function name; whether a process has
    executed it before the claim that gave this process ``epoch`` (``started``, or an
    earlier claim other than an upgrade's: a fork that was never resumed has neither; the
    ``resumed`` event of a claim is written with the claimant's first step and can be lost
    with it); the attempts ``tcc retry`` issued, as (call key, attempt); and its code
    manifest."""
    name, retried = None, set()
    events = store.events(run_id)
    for event in events:
        data = dict(event.data)
        if event.kind == "started":
            name = data.get("verify")
        elif event.kind == "retried" and isinstance(data.get("key"), str) \
                and isinstance(data.get("attempt"), int):
            retried.add((data["key"], data["attempt"]))
    return name, _executed(events, before=epoch), retried, manifest_of(events)


def _make_driver(store: Store, run: RunInfo, strategy: str, *, checkpoint_every: int, lease: float,
                 progress: Progress | None, wait_seconds: float, verify: Any,
                 modules: ModuleState | None = None, manifest: Manifest | None = None,
                 pinned: PinnedCode | None = None) -> Driver:
    """``pinned``: the code the run continues on, when that is its recorded code (a child it
    spawns starts on that code too)."""
    if modules is None and strategy != "replay":
        modules = ModuleState(_scripts.entry_module(run.entry))
    code = None
    if strategy != "replay":  # the code a snapshot needs, recorded with it (--code pinned)
        code = CodeRecorder(store, run.run_id, run.epoch, project_root(run.entry), manifest or {})
        if pinned is not None:  # a current module of a name the run runs pinned is not its code
            code.pinned_from.update(pinned.names())
            code.record_pinned = pinned.active

    def spawner(child_id: str, func: str, args: tuple[Any, ...]) -> tuple[str, Any]:
        try:
            child = store.get_run(child_id)
        except errors.RunNotFoundError:
            child = None
        if child is not None and child.status in FINISHED_STATUSES:
            return decode_child(child)
        resolver = process_modules()  # the child's run may set its own: the parent's after
        try:
            if child is None:
                try:
                    # a parent on its recorded code starts its child on that code too, with
                    # the parent's policy
                    sibling = _scripts.sibling_entry(run.entry, func)
                    on_pinned = pinned is not None and pinned.active
                    outcome = start(
                        store, sibling if on_pinned else _scripts.resolve(sibling), args, run_id=child_id,
                        strategy=strategy, checkpoint_every=checkpoint_every, lease=lease,
                        wait_seconds=wait_seconds, parent=run.run_id,
                        pinned=pinned if on_pinned else None,
                        on_code_change=policy_of(store.events(run.run_id)))
                except errors.UsageError as exc:  # e.g. arguments the child cannot take: the
                    return ("throw", TypeError(f"tcc.spawn({func}): {exc}"))  # parent's error
            else:  # re-attach to a child that a crash interrupted
                outcome = resume(store, child_id, lease=lease, wait_seconds=wait_seconds)
        finally:
            set_process_modules(resolver)
        if outcome.status == "stopped":  # SIGTERM inside the child: the parent stops too,
            raise Parked("stopped", {"reason": "SIGTERM", "child": child_id})  # unrecorded
        if outcome.status in PARKED_STATUSES:
            store.add_event(run.run_id, "parked", {"status": "waiting", "child": child_id})
            store.set_status(run.run_id, run.epoch, "waiting")
            raise Parked("waiting", {"child": child_id, "child_status": outcome.status})
        return decode_child(store.get_run(child_id))

    return Driver(
        store, run.run_id, run.epoch, snapshots=strategy != "replay",
        checkpoint_every=checkpoint_every, lease=lease, progress=progress, wait_seconds=wait_seconds,
        verify=verify, spawner=spawner, modules=modules, code=code,
    )


def send_signal(store: Store, run_id: str, name: str, value: bytes) -> str:
    """Deliver ``value`` (JSON bytes) to the next ``tcc.wait_for(name)`` of the run that has
    not ended, and return that wait's id (``NAME@k``).

    Waits on one name are numbered in the order the run reaches them, and a signal may
    arrive before its wait: it goes to the lowest number that holds no signal yet, skipping
    waits that already ended (a wait that timed out consumed nothing, and a signal left in
    its slot would never be read while the run waits at the next one).
    """
    run = store.get_run(run_id)
    if run.status in FINAL_STATUSES:  # nothing will ever read it
        raise errors.UsageError(f"run {run_id} is already {run.status}; a signal would never be read")
    ended = set()
    now = time.time()
    for call in logged_calls(store.journal(run_id)):
        if call.name == WAIT_EFFECT:
            wait_id, deadline = read_wait_args(load_payload(call.args))
            # ended, or past its deadline: a signal sent now is one that wait never gets (it
            # times out, uninterrupted or after a crash), so it goes to the next wait
            if wait_id is not None and (call.outcome is not None or (deadline is not None and deadline <= now)):
                ended.add(wait_id)
    for n in range(1, 100_000):
        wait_id = f"{name}@{n}"
        if wait_id not in ended and store.send_signal(run_id, wait_id, value):
            return wait_id
    raise errors.UsageError(f"run {run_id} has no free slot for another signal {name!r}")


def reusable_run(store: Store, run_id: str, script: str | Callable[..., Any], args: Sequence[Any]) -> RunInfo | None:
    """``tcc run --run-id ID SCRIPT ARGS``: the unfinished run ``ID`` to resume, or None if
    there is no run ``ID`` (start it).

    An existing run is resumed only when it is the same call: the same script, entry
    function and arguments.  Anything else is refused, naming both, because resuming would
    quietly finish the old script with the old arguments.  A finished run is refused too.
    """
    try:
        existing = store.get_run(run_id)
    except errors.RunNotFoundError:
        return None
    if existing.status in FINISHED_STATUSES:
        raise errors.UsageError(
            f"run {run_id} exists and is {existing.status}; choose another --run-id"
            + (f" (or `tcc retry {run_id}` to issue its failed call again)"
               if existing.status == "failed" else ""))
    entry = _entry(script)
    try:
        old_args = json.loads(existing.args or b"[]")
    except ValueError:
        old_args = None
    if existing.entry != entry or old_args != list(args):
        raise errors.UsageError(
            f"run {run_id} exists and is {existing.status}, but as {existing.entry} "
            f"{json.dumps(old_args)}, not {entry} {json.dumps(list(args))}; `tcc run --run-id` "
            f"resumes only the same script with the same arguments: use `tcc resume {run_id}` "
            "to continue it as it is, or choose another --run-id")
    return existing


def _new_run(script: str | Callable[..., Any], args: Sequence[Any], on_code_change: str,
             pinned: PinnedCode | None = None) -> tuple[str, Any]:
    """The stored entry of a new run of ``script`` and its function, once the usage errors
    a new run can have (an unknown policy, no such function, arguments it cannot take) are
    ruled out, before anything is stored.  ``pinned``: the function comes from that
    recorded code, and ``script`` is the stored entry of it."""
    if on_code_change not in CODE_POLICIES:
        raise errors.UsageError(f"unknown --on-code-change policy {on_code_change!r}; choose one "
                                f"of {', '.join(CODE_POLICIES)}")
    entry = script if pinned is not None and isinstance(script, str) else _entry(script)
    func = _entry_function(entry, pinned) if pinned is not None else _scripts.resolve(entry)
    check_call(func, args, entry)
    return entry, func


def start(
    store: Store,
    script: str | Callable[..., Any],
    args: Sequence[Any] = (),
    *,
    run_id: str | None = None,
    strategy: str = "continuation",
    checkpoint_every: int = 1,
    lease: float = 30.0,
    progress: Progress | None = None,
    on_created: Callable[[RunInfo], None] | None = None,
    wait_seconds: float = 0.0,
    verify: str | None = None,
    parent: str | None = None,
    keep: int | None = None,
    on_notice: Callable[[str], None] | None = None,
    on_code_change: str = DEFAULT_POLICY,
    pinned: PinnedCode | None = None,
) -> Outcome:
    """Create a run of ``script`` (``path[:func]``, or a function object of an importable
    module or of the ``__main__`` script) and drive it to the end.

    ``strategy``: ``continuation`` (a snapshot after every ``checkpoint_every``
    effects, default 1), ``hybrid`` (the same with ``checkpoint_every`` = K,
    recovering by snapshot plus replay of the journal tail) or ``replay`` (no
    snapshots: recovery re-executes from the start against the journal).
    ``keep``: how many newest snapshots the run retains (default: the store's).
    ``on_notice(text)`` is told what the user should know before the run starts (module
    globals that cannot be captured); the same is recorded in the ``started`` event.
    ``pinned``: start on that recorded code (a child of a run that continues on its
    recorded code, ``tcc.spawn``), not on the current files.
    """
    entry, func = _new_run(script, args, on_code_change, pinned)
    check = _verify_func(entry, verify, pinned) if parent is None or verify else None
    if is_sync(func):
        strategy = "replay"
    strategy, _notice = effective_strategy(strategy)
    label = strategy_label(strategy, checkpoint_every)
    run = store.create_run(
        entry, json.dumps(list(args)).encode(), strategy=label, run_id=run_id, lease=lease,
        keep=keep, spawned_by=parent,
    )
    if on_created is not None:
        on_created(run)
    info: dict[str, Any] = {"pid": os.getpid(), "strategy": strategy, "on_code_change": on_code_change}
    if check is not None:
        info["verify"] = check.__name__
    if parent is not None:
        info["parent"] = parent
        store.add_event(parent, "spawned", {"child": run.run_id, "entry": entry})
        if store.get_run(parent).status == "cancelled":
            # `tcc cancel` of the parent read its children before this one was listed: cancel
            # it here, or it would wait for ever
            store.cancel_run(run.run_id, reason=f"its parent run {parent} was cancelled")
            raise errors.FencedError(
                f"run {parent!r} was cancelled while it spawned child run {run.run_id!r}; the "
                "child was cancelled too and nothing more was written")
    modules = None
    if strategy != "replay":
        modules = ModuleState(_scripts.entry_module(entry)) if pinned is None else \
            ModuleState(pinned.entry_module(entry), resolve=pinned.resolve, pinned=pinned.active)
    left = modules.left_to_import() if modules is not None else []
    if left:
        info["rebuilt_by_import"] = left
    unheld = process_state_notes(modules.agent_modules()) if modules is not None else []
    if unheld:
        info["process_state"] = unheld
    store.add_event(run.run_id, "started", info)
    if left and on_notice is not None and parent is None:
        on_notice(f"module-level {', '.join(left)} cannot be captured: a resumed run gets the "
                  "object a fresh import builds, so what the run changes inside it is lost "
                  "(keep run data in capturable values; see README, \"Module-level data\")")
    if unheld and on_notice is not None and parent is None:
        for note in unheld:
            on_notice(f"{note} (README, \"Process state\")")
    driver = _make_driver(store, run, strategy, checkpoint_every=checkpoint_every, lease=lease,
                          progress=progress, wait_seconds=wait_seconds, verify=check,
                          modules=modules, pinned=pinned)
    # The run's code, recorded before its first effect, so that a crash before its first
    # snapshot resumes on this code too; and before the coroutine is made, which a failure
    # here (a lost database connection) would leave never awaited.
    if driver.code is not None:
        driver.code.record(deferred=False)
    coro = _make_coroutine(func, args, entry, run.run_id, store.tenant)
    return driver.drive(coro)


def submit(
    store: Store,
    script: str | Callable[..., Any],
    args: Sequence[Any] = (),
    *,
    run_id: str | None = None,
    strategy: str = "continuation",
    checkpoint_every: int = 1,
    verify: str | None = None,
    keep: int | None = None,
    on_code_change: str = DEFAULT_POLICY,
) -> RunInfo:
    """``tcc submit``: create a run of ``script`` in status ``queued`` for a worker (on any
    host that shares the store) to start; return it at once.

    The script is imported here, as :func:`start` does, so that a wrong entry, arguments
    it cannot take or an unknown ``verify`` are refused now rather than by a worker later;
    the workers must see the script at the same path.  The options are :func:`start`'s and
    are recorded in its ``created`` event; the worker's ``tcc resume`` starts the run
    with them (a ``started`` event)."""
    entry, func = _new_run(script, args, on_code_change)
    check = _verify_func(entry, verify)
    if is_sync(func):
        strategy = "replay"
    strategy, _notice = effective_strategy(strategy)
    info: dict[str, Any] = {"pid": os.getpid(), "host": HOST, "strategy": strategy,
                            "on_code_change": on_code_change}
    if check is not None:
        info["verify"] = check.__name__
    # the options go into the run's `created` event: a worker that starts the run at once
    # reads them with it
    return store.create_run(
        entry, json.dumps(list(args)).encode(), strategy=strategy_label(strategy, checkpoint_every),
        run_id=run_id, status="queued", keep=keep, info=info)


def _submitted(store: Store, run_id: str) -> dict[str, Any]:
    """The options a queued run was submitted with (its ``created`` event)."""
    for event in store.events(run_id):
        if event.kind == "created":
            return {k: v for k, v in event.data.items()
                    if k in ("strategy", "on_code_change", "verify")}
    return {}


def retry(store: Store, run_id: str, **options: Any) -> Outcome:
    """``tcc retry``: continue a run that failed because an effect call failed for good
    (its retries spent during an outage, say), by issuing that call again as a new attempt
    with the same idempotency key and the effect's retries, from the snapshot the run took
    at that call.  ``options`` are :func:`resume`'s."""
    return resume(store, run_id, retry_failed=True, **options)


def check_retry(store: Store, run_id: str) -> None:
    """What :func:`retry` refuses before it takes anything over: UsageError unless run
    ``run_id`` failed in an effect call it can issue again."""
    run = store.get_run(run_id)
    if run.status != "failed":
        raise errors.UsageError(f"run {run_id} is {run.status}, not failed; there is nothing to retry"
                                + (f" (`tcc resume {run_id}` continues it)"
                                   if run.status not in (*RETURNED_STATUSES, *FINAL_STATUSES) else ""))
    _failed_call(store, run)


def _failed_call(store: Store, run: RunInfo) -> LoggedCall:
    """The effect call a failed run failed in, which :func:`retry` issues again; UsageError
    if there is none (the run failed in its own code, or in a gathered call)."""
    journal = logged_calls(store.journal(run.run_id))
    failing = journal[-1] if journal else None
    if failing is None or failing.outcome is None or failing.outcome[0] != "throw" \
            or failing.name in (WAIT_EFFECT, SLEEP_EFFECT, SPAWN_EFFECT):
        raise errors.UsageError(
            f"run {run.run_id} did not fail in an effect call, so there is no call to retry; "
            "`tcc show` says where it failed")
    error = json.loads(run.error or b"{}")
    exc = failing.outcome[1]
    if error.get("type", "").rpartition(".")[2] != type(exc).__name__ or error.get("message") != str(exc):
        raise errors.UsageError(
            f"run {run.run_id} failed with {error.get('type', '?')}: {error.get('message', '?')}, "
            f"not with the error of its last effect call {failing.name} ({type(exc).__name__}: "
            f"{exc}), which the agent handled; there is no failed call to retry")
    if "." in failing.key.rpartition(":")[2]:
        raise errors.UsageError(
            f"run {run.run_id} failed in a call of a tcc.gather(); retrying one gathered call "
            "is not supported: fork the run from an earlier snapshot instead")
    return failing


def _retry_plan(store: Store, run: RunInfo, resumption: Resumption, calls: int,
                replay: list[LoggedCall]) -> tuple[Resumption, int, list[LoggedCall]]:
    """``resumption``, the call count and the journal to serve for :func:`retry`."""
    failing = _failed_call(store, run)
    again = dataclasses.replace(failing, outcome=None, retry=True)
    if resumption[0] == "throw" and failing.key.rpartition(":")[2] == str(calls) \
            and all(c.key == failing.key for c in replay):
        # the snapshot was taken at the failed call, and the frame still awaits it (what
        # the journal holds after it are earlier retries of that same call)
        args, kwargs = load_payload(failing.args)
        return ("request", EffectRequest(failing.name, args, kwargs)), calls - 1, [again]
    if replay and replay[-1].key == failing.key:  # served from the journal, then re-issued
        return resumption, calls, [c for c in replay[:-1] if c.key != failing.key] + [again]
    raise errors.UsageError(
        f"run {run.run_id}: no retained snapshot was taken at or before its failed call "
        f"{failing.name} ({failing.key}); it cannot be retried")


def _interrupted_retry(store: Store, run_id: str, resumption: Resumption, calls: int,
                       replay: list[LoggedCall], retried: set[tuple[str, int]],
                       ) -> tuple[Resumption, int, list[LoggedCall]]:
    """``resumption``, the call count and the journal to serve for a run whose ``tcc
    retry`` was interrupted by a crash while its new attempt ran.

    The snapshot was taken at the failed call, so resuming it would throw the old failure
    into the agent again, though the new attempt may have run and succeeded.  The call is
    issued again instead, as ``tcc retry`` does: from its open intent (in doubt: the verify
    probe is asked, else it runs again), or, where a crash of the store's server took that
    intent (``retried``: the attempts a ``retried`` event names), after asking the probe
    about the attempt.  Anything else is left as it is."""
    if any(c.key.rpartition(":")[2] != str(calls) for c in replay):
        return resumption, calls, replay
    journal = logged_calls(store.journal(run_id))
    failing = journal[-1] if journal else None
    if failing is None or failing.key.rpartition(":")[2] != str(calls) \
            or failing.name in (WAIT_EFFECT, SLEEP_EFFECT, SPAWN_EFFECT):
        return resumption, calls, replay
    if failing.outcome is None:  # the retried attempt's intent is open
        again = failing
    elif failing.outcome[0] == "throw" and (failing.key, failing.attempt + 1) in retried:
        again = dataclasses.replace(failing, retry=True, unrecorded=True)
    else:
        return resumption, calls, replay
    args, kwargs = load_payload(failing.args)
    return ("request", EffectRequest(failing.name, args, kwargs)), calls - 1, [again]


def resume(
    store: Store,
    run_id: str,
    *,
    strategy: str | None = None,
    checkpoint_every: int | None = None,
    lease: float = 30.0,
    steal: bool = False,
    progress: Progress | None = None,
    wait_seconds: float = 0.0,
    retry_failed: bool = False,
    code: str | None = None,
    on_notice: Callable[[str], None] | None = None,
    claimed_epoch: int | None = None,
    continued: bool = False,
) -> Outcome:
    """Continue an unfinished run with its strategy (or ``strategy``); start a ``queued``
    one (``tcc submit``).

    continuation/hybrid: from the newest good snapshot, serving the journal
    after it; replay: from the start, serving the whole journal.
    ``retry_failed``: see :func:`retry`.  ``code``: ``current`` (the code as it is
    now; a suspended frame whose code changed is refused), ``pinned`` (the code the
    run recorded, if the files differ from it; see :mod:`tcc.runtime._pinning`) or
    ``upgrade`` (what the upgrade policy does, for this resume); None:
    what the run's ``--on-code-change`` policy says (``pinned`` unless set otherwise;
    ``upgrade`` runs :func:`tcc.runtime.upgrade` first).  ``on_notice(text)`` hears
    which code the run continues on when its files changed.  ``claimed_epoch``: the worker
    that started this process claimed the run at that epoch and hands it over (see
    :meth:`tcc.store.Store.claim_run`, ``expect_epoch``).  ``continued``: this process
    stopped the run itself at a snapshot and goes on with it (an upgrade between two legs
    of one resume), which is no crash.
    """
    if code is not None and code not in CODE_MODES:
        raise errors.UsageError(f"unknown code mode {code!r}; choose one of {', '.join(CODE_MODES)}")
    run = store.get_run(run_id)
    if retry_failed:  # refused before the claim: a refusal takes nothing over
        check_retry(store, run_id)
    if run.status in FINAL_STATUSES:
        raise errors.UsageError(f"run {run_id} is already {run.status}; there is nothing to resume")
    if run.status == "importing":
        raise errors.UsageError(
            f"run {run_id} is being imported (`tcc import`), or its import was interrupted: "
            "import the file again (that replaces it), then resume it")
    stored_every = parse_strategy(run.strategy)[1]
    if checkpoint_every is None:
        checkpoint_every = stored_every
    strategy, _notice = effective_strategy(strategy or run.strategy)
    # Which code the run continues on (a run already on its pinned code stays on it), and
    # the usage errors of loading it, before the claim.
    asked = code
    code, known, upgrade_next, claimed_epoch = _code_mode(store, run, strategy, code, on_notice,
                                                          claimed_epoch, retry_failed)
    pinned = PinnedCode(store, run_id, known, pin=code == "pinned")
    if code == "pinned" and strategy != "replay":
        _check_pinnable(run, strategy, pinned)
        if pinned.remap and on_notice is not None and not upgrade_next:
            names = ", ".join(_scripts.script_display_name(n) for n in pinned.changed)
            on_notice(f"run {run_id} continues on the code it recorded ({names} changed since); "
                      f"`tcc upgrade {run_id}` moves it onto the current code")
    func = _entry_function(run.entry, pinned)
    if is_sync(func):
        strategy = "replay"
    # Only a run that was executing when its owner went away can have lost the intent of
    # a call in flight; a parked or failed run recorded its status after its last call,
    # and a fork that was never resumed has issued nothing of its own.
    crashed = run.status == "running" and not continued
    queued = run.status == "queued"
    try:
        run = store.claim_run(run_id, lease=lease, steal=steal, expect_epoch=claimed_epoch)
    except errors.FencedError:
        # Another process finished the run since it was read above: the same
        # answer (and exit code) as when this process saw it finished.
        status = store.get_run(run_id).status
        if status in FINAL_STATUSES:
            raise errors.UsageError(
                f"run {run_id} is already {status}; there is nothing to resume") from None
        raise

    if queued:  # a submitted run starts here, with the options it was submitted with
        store.add_event(run_id, "started", {**_submitted(store, run_id), "pid": os.getpid(),
                                            "queued": True})
    verify_name, executed, retried, manifest = _history(store, run_id, run.epoch)  # (before this claim)
    crashed = crashed and executed
    if pinned.active:  # the journal's values name the run's modules too
        set_process_modules(pinned.resolve)
    snapshot = store.latest_good_snapshot(run_id) if strategy != "replay" else None
    # What the fresh import bound, before a snapshot's module-level data overwrites it.
    modules = ModuleState(pinned.entry_module(run.entry), resolve=pinned.resolve, pinned=pinned.active) \
        if strategy != "replay" else None
    if snapshot is not None:
        info, payload = snapshot
        try:
            stored = load_payload(unseal(payload, authenticated=True),  # the store verified it
                                  modules=pinned.resolve)
        except errors.RestoreError as exc:
            raise type(exc)(
                f"run {run_id}: snapshot {info.number} cannot be restored: {exc} "
                f"({_restore_hint(run_id, exc, code, manifest)})"
            ) from exc
        state = unpack_state(stored, run_id, info.number)
        coro, resumption, calls, waits = state.coro, state.resumption, state.calls, state.waits
        if state.module_state is not None and modules is not None:
            modules.restore(state.module_state)
        start_seq = info.journal_len
        resumed: dict[str, Any] = {"snapshot": info.number, "journal": start_seq, "pid": os.getpid()}
    else:
        coro = _make_coroutine(func, json.loads(run.args or b"[]"), run.entry, run_id, store.tenant)
        resumption, calls, start_seq, waits = ("send", None), 0, 0, {}
        resumed = {"snapshot": None, "journal": 0, "pid": os.getpid()}
    # with the first step's commit (or a park): a crash before it makes it moot, and the
    # claim's own event (durable) already says that a process took the run up
    store.add_event(run_id, "resumed", resumed, epoch=run.epoch, deferred=True)
    tail = store.journal(run_id, start_seq)
    resumption = answered_request(resumption, tail)
    replay = logged_calls(tail)
    if retry_failed:
        resumption, calls, replay = _retry_plan(store, run, resumption, calls, replay)
    elif resumption[0] == "throw" and crashed:
        resumption, calls, replay = _interrupted_retry(
            store, run_id, resumption, calls, replay,
            retried if not store.intents_durable else set())
    if run.status != "running":  # only once the state loaded: a refusal changes nothing
        run = store.set_status(run_id, run.epoch, "running", error=b"")  # a retried failure
    check = _verify_func(run.entry, verify_name, pinned) if verify_name else None
    driver = _make_driver(store, run, strategy, checkpoint_every=checkpoint_every, lease=lease,
                          progress=progress, wait_seconds=wait_seconds, verify=check,
                          modules=modules, manifest=manifest, pinned=pinned)
    driver.stop_after_snapshot = upgrade_next
    outcome = driver.drive(coro, resumption, calls=calls, replay=replay, waits=waits, resumed=crashed,
                           retried=retried)
    if upgrade_next and outcome.status == "stopped" and (outcome.parked or {}).get("reason") == "upgrade":
        # its next snapshot is taken (on the recorded code): the policy moves it now
        set_process_modules(None)
        return resume(store, run_id, strategy=strategy, checkpoint_every=checkpoint_every,
                      lease=lease, progress=progress, wait_seconds=wait_seconds,
                      code="upgrade" if asked == "upgrade" else None,  # (else its policy's)
                      on_notice=on_notice, continued=True)
    return outcome
