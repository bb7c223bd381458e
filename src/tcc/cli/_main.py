"""Argument parsing and exit codes for ``tcc``.

Exit codes: 0 success, 1 a tcc error or a failed run (one line on stderr,
traceback only with ``--debug``), 2 a usage error.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import warnings
from typing import Any, Sequence

from .. import _version
from ..errors import TccError, UsageError
from ..runtime import CODE_POLICIES, STRATEGIES
from ..store import DURABILITIES, FINAL_STATUSES, RUN_STATUSES, default_keep
from . import _render, _transfer


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", metavar="PATH|URL",
                        help="store directory, or postgresql://USER@HOST:PORT/DB (default: "
                             "$TCC_STORE or ./.tcc)")
    parser.add_argument("--key-file", metavar="PATH",
                        help="the store key (64 hex digits, mode 0600): needed by a PostgreSQL "
                             "store; encrypts a new LMDB store (default: $TCC_STORE_KEY_FILE)")
    parser.add_argument("--tenant", default="default", help="tenant the runs belong to (default: default)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.add_argument("--durability", choices=DURABILITIES,
                        default=os.environ.get("TCC_DURABILITY", "sync"),
                        help="commit durability (default: sync, or $TCC_DURABILITY); see README")
    # SUPPRESS: absent here, the top-level `tcc --debug COMMAND` value stands
    parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show tracebacks on errors")


def _check_args(args: argparse.Namespace) -> None:
    """Usage errors in option values, before any store is opened or created."""
    durability = getattr(args, "durability", "sync")
    if durability not in DURABILITIES:  # only $TCC_DURABILITY can get here
        raise UsageError(f"TCC_DURABILITY={durability!r} is not one of {', '.join(DURABILITIES)}")
    for name, least, strict in (("checkpoint_every", 1, False), ("keep", 1, False), ("lease", 0, True),
                                ("wait", 0, False), ("poll", 0, True), ("concurrency", 1, False)):
        value = getattr(args, name, None)
        if value is not None and not math.isfinite(value):  # nan, inf: a lease of nan renews
            raise UsageError(f"--{name.replace('_', '-')} must be a finite number, not {value}")
        if value is not None and (value <= least if strict else value < least):
            flag = "--" + name.replace("_", "-")
            bound = f"more than {least}" if strict else f"at least {least}"
            raise UsageError(f"{flag} must be {bound}, not {value}")
    from ..store import check_name

    for name in ("run_id", "new_run_id"):
        value = getattr(args, name, None)
        if value == "":
            raise UsageError("a run id cannot be empty")
        if value is not None:  # UsageError naming it; a new id may not start with '-'
            check_name("run id", value, new=name == "new_run_id" or args.command in ("run", "submit"))
    if hasattr(args, "tenant"):
        check_name("tenant", args.tenant)
        default_keep()  # a bad $TCC_KEEP is a usage error before any store is opened


def _columns() -> int:
    """The terminal's width, as ``shutil.get_terminal_size()`` finds it ($COLUMNS, then
    standard output's terminal, else 80)."""
    try:
        columns = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


class _Formatter(argparse.HelpFormatter):
    """argparse's help formatter, finding the terminal's width without importing shutil
    (with bz2, lzma and fnmatch: ~4 ms).  argparse makes one at every ``add_argument``,
    also in a `tcc resume`, which never prints help."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                 width: int | None = None, **kwargs: Any) -> None:
        super().__init__(prog, indent_increment, max_help_position,
                         _columns() - 2 if width is None else width, **kwargs)


class _Skipped:
    """Stands in for the parser of a command this invocation does not run: every call on it
    does nothing.  (Building all of them is ~10 ms of every `tcc resume`.)"""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: self


class _OnlyCommand:
    """``add_subparsers()``'s action, building only the parser of ``command`` (all of them
    when it is None: `tcc --help`, or a command argparse should call unknown)."""

    def __init__(self, sub: Any, command: str | None) -> None:
        self.sub = sub
        self.command = command

    def add_parser(self, name: str, **kwargs: Any) -> Any:
        if self.command is None or name == self.command:
            return self.sub.add_parser(name, formatter_class=_Formatter, **kwargs)
        return _Skipped()


COMMANDS = ("run", "submit", "resume", "retry", "signal", "approve", "reject", "cancel", "fork", "upgrade", "inspect",
            "worker", "ls", "show", "gc", "init", "ui", "export", "import", "info")


def _command_of(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names, if it names one of :data:`COMMANDS` (the top-level
    options take no values, so it is the first word that is not an option)."""
    for word in argv:
        if not word.startswith("-"):
            return word if word in COMMANDS else None
    return None


def _parser(command: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tcc",
        description="Transparent continuation checkpointing: crash-proof async Python agents.",
        formatter_class=_Formatter,
    )
    parser.add_argument("--version", action="version", version=f"tcc {_version.__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub: Any = _OnlyCommand(parser.add_subparsers(dest="command", metavar="COMMAND"), command)

    run = sub.add_parser("run", help="run SCRIPT[:FUNC] as a durable run")
    _common(run)
    run.add_argument("--run-id", help="id for the run; an unfinished run with this id is resumed")
    run.add_argument("--strategy", default="continuation", choices=STRATEGIES,
                     help="recovery strategy: continuation (snapshot after every effect, resume it), "
                          "hybrid (snapshot every K effects, replay the tail) or replay (re-execute "
                          "from the start against the journal); default continuation")
    run.add_argument("--checkpoint-every", "--snapshot-every", dest="checkpoint_every", type=int,
                     default=None, metavar="K",
                     help="snapshot after every K effects (default 1; 10 for hybrid)")
    run.add_argument("--lease", type=float, default=30.0, metavar="SECONDS",
                     help="ownership lease, renewed while the run is alive (default: 30)")
    run.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                     help="at a tcc.wait_for/approval, wait this long in-process before parking")
    run.add_argument("--keep", type=int, default=None, metavar="N",
                     help="retain the N newest snapshots of this run (default: $TCC_KEEP, else 3); "
                          "older ones are deleted, so `tcc fork --at`/`inspect --at` cannot reach them")
    run.add_argument("--verify", metavar="FUNC",
                     help="check the result with FUNC(result) before completing (default: the "
                          "script's verify() if it has one); a failed check leaves the run unverified")
    run.add_argument("--on-code-change", choices=CODE_POLICIES, default="pinned",
                     help="when the run's files change while it is suspended, a resume (or the "
                          "worker) continues it on the code it recorded (pinned, the default), "
                          "refuses (refuse), or moves it onto the new code first (upgrade)")
    run.add_argument("script", metavar="SCRIPT[:FUNC]", help="the agent script and its async entry (main)")
    run.add_argument("args", nargs=argparse.REMAINDER,
                     help="arguments passed to FUNC as strings (everything after SCRIPT, so tcc "
                          "options go before it)")
    run.set_defaults(handler=_cmd_run)

    submit = sub.add_parser("submit", help="queue a run of SCRIPT[:FUNC] for a worker (`tcc worker`, "
                            "on any host sharing the store) to start; prints its id")
    _common(submit)
    submit.add_argument("--run-id", help="id for the run (default: a new random id); must be new")
    submit.add_argument("--strategy", default="continuation", choices=STRATEGIES,
                        help="recovery strategy, as for `tcc run` (default continuation)")
    submit.add_argument("--checkpoint-every", "--snapshot-every", dest="checkpoint_every", type=int,
                        default=None, metavar="K", help="snapshot after every K effects (default 1; "
                        "10 for hybrid)")
    submit.add_argument("--keep", type=int, default=None, metavar="N",
                        help="retain the N newest snapshots of this run (default: $TCC_KEEP, else 3)")
    submit.add_argument("--verify", metavar="FUNC", help="as for `tcc run`")
    submit.add_argument("--on-code-change", choices=CODE_POLICIES, default="pinned",
                        help="as for `tcc run` (default pinned)")
    submit.add_argument("script", metavar="SCRIPT[:FUNC]",
                        help="the agent script (the workers must see it at this path) and its entry")
    submit.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to FUNC as strings")
    submit.set_defaults(handler=_cmd_submit)

    resume = sub.add_parser("resume", help="continue an unfinished run from its newest snapshot")
    _common(resume)
    resume.add_argument("--strategy", choices=STRATEGIES,
                        help="override the run's recovery strategy")
    resume.add_argument("--checkpoint-every", "--snapshot-every", dest="checkpoint_every", type=int,
                        default=None, metavar="K", help="snapshot interval (default: the run's)")
    resume.add_argument("--lease", type=float, default=30.0, metavar="SECONDS",
                        help="ownership lease, renewed while the run is alive (default: 30)")
    resume.add_argument("--steal", action="store_true", help="take the run even if its owner's lease is live")
    resume.add_argument("--code", choices=("current", "pinned", "upgrade"), default=None,
                        help="current: the code as it is now, refused where a suspended frame's "
                        "code changed; pinned: the code the run recorded, if the files changed "
                        "since; upgrade: as the upgrade policy does, for this resume; default: "
                        "the run's --on-code-change policy (README, \"Changing code under "
                        "running agents\")")
    resume.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                        help="at a tcc.wait_for/approval, wait this long in-process before parking")
    # a worker hands the run it claimed at this epoch to the resume it starts
    resume.add_argument("--claimed-epoch", type=int, default=None, help=argparse.SUPPRESS)
    resume.add_argument("run_id", metavar="RUN_ID")
    resume.set_defaults(handler=_cmd_resume)

    retry = sub.add_parser("retry", help="continue a run that failed in an effect call: issue that "
                           "call again (same idempotency key, a new attempt)")
    _common(retry)
    retry.add_argument("--lease", type=float, default=30.0, metavar="SECONDS",
                       help="ownership lease, renewed while the run is alive (default: 30)")
    retry.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                       help="at a tcc.wait_for/approval, wait this long in-process before parking")
    retry.add_argument("--code", choices=("current", "pinned", "upgrade"), default=None,
                       help="as for `tcc resume`: which code the retried run continues on when its "
                       "files changed (default: its --on-code-change policy)")
    retry.add_argument("run_id", metavar="RUN_ID")
    retry.set_defaults(handler=_cmd_retry)

    signal = sub.add_parser("signal", help="deliver a value to a run's tcc.wait_for(NAME)")
    _common(signal)
    signal.add_argument("run_id", metavar="RUN_ID")
    signal.add_argument("name", metavar="NAME")
    signal.add_argument("--value", default="null", metavar="JSON", help="the value, as JSON (default null)")
    signal.set_defaults(handler=_cmd_signal)

    for verb, approved in (("approve", True), ("reject", False)):
        answer = sub.add_parser(verb, help=f"{verb} the run's pending tcc.approval")
        _common(answer)
        answer.add_argument("run_id", metavar="RUN_ID")
        answer.add_argument("--comment", default=None, help="recorded with the answer")
        answer.set_defaults(handler=_cmd_answer, approved=approved)

    cancel = sub.add_parser("cancel", help="cancel a run: it is never resumed again; a live owner "
                            "stops at its next effect or checkpoint")
    _common(cancel)
    cancel.add_argument("run_id", metavar="RUN_ID")
    cancel.add_argument("--reason", default=None, help="recorded in the run's cancelled event")
    cancel.set_defaults(handler=_cmd_cancel)

    fork = sub.add_parser("fork", help="create a new run from a snapshot of RUN_ID (not started)")
    _common(fork)
    fork.add_argument("run_id", metavar="RUN_ID")
    fork.add_argument("--at", type=int, default=None, metavar="N", help="snapshot number (default: newest)")
    fork.add_argument("--set", action="append", default=[], metavar="NAME=JSON",
                      help="change a local of the innermost agent frame before the fork resumes")
    fork.add_argument("--answer", metavar="JSON", default=None,
                      help="replace the answer the resumed frame receives from the effect call "
                           "it awaits (\"what if the model had answered X?\")")
    fork.add_argument("--run-id", dest="new_run_id", help="id for the new run")
    fork.set_defaults(handler=_cmd_fork)

    upg = sub.add_parser("upgrade", help="move a suspended run onto the current code (a new "
                         "snapshot; see --dry-run first)")
    _common(upg)
    upg.add_argument("run_id", metavar="RUN_ID")
    upg.add_argument("--dry-run", action="store_true",
                     help="print the mapping, frame by frame, and write nothing")
    upg.add_argument("--set", action="append", default=[], metavar="NAME=JSON",
                     help="the value of a new local that the new code reads after the suspension point")
    upg.add_argument("--rename", action="append", default=[], metavar="OLD=NEW",
                     help="a local the new code renamed: map OLD's value onto NEW")
    upg.add_argument("--steal", action="store_true",
                     help="upgrade even if the run's owner holds a live lease (it is fenced)")
    upg.set_defaults(handler=_cmd_upgrade)

    insp = sub.add_parser("inspect", help="show a snapshot's frozen call stack and locals (runs no user code)")
    _common(insp)
    insp.add_argument("run_id", metavar="RUN_ID")
    insp.add_argument("--at", type=int, default=None, metavar="N", help="snapshot number (default: newest)")
    insp.add_argument("--unsafe-repr", action="store_true",
                      help="DANGEROUS: load the snapshot with the real unpickler, import the run's "
                           "script and use the objects' own __repr__. This runs any code in the "
                           "snapshot, as you: only for a store you trust. Asks you to type yes on a "
                           "terminal; elsewhere it needs --yes")
    insp.add_argument("--yes", action="store_true",
                      help="with --unsafe-repr: do not ask (needed when stdin is not a terminal)")
    insp.set_defaults(handler=_cmd_inspect)

    worker = sub.add_parser("worker", help="supervise the store: resume dead, due and signalled runs")
    _common(worker)
    worker.add_argument("--concurrency", type=int, default=4, metavar="N", help="runs at once (default 4)")
    worker.add_argument("--poll", type=float, default=None, metavar="SECONDS",
                        help="poll interval (default 1; 5 on PostgreSQL, where new work wakes the "
                             "worker at once and the poll is the fallback)")
    worker.add_argument("--lease", type=float, default=30.0, metavar="SECONDS",
                        help="the lease of the runs it resumes: a run whose host dies is taken "
                             "over by another host this long after its last renewal (default 30)")
    worker.add_argument("--once", action="store_true", help="one poll, then wait for the started runs")
    worker.set_defaults(handler=_cmd_worker)

    ls = sub.add_parser("ls", help="list runs")
    _common(ls)
    ls.add_argument("--status", help="only runs with this status",
                    choices=RUN_STATUSES)
    ls.set_defaults(handler=_cmd_ls)

    show = sub.add_parser("show", help="show one run: status, result, effects, checkpoints, events")
    _common(show)
    show.add_argument("run_id", metavar="RUN_ID")
    paging = show.add_mutually_exclusive_group()
    paging.add_argument("--calls", type=int, metavar="N",
                        help=f"list the last N effect calls (default {_render.SHOWN_CALLS}, with "
                             f"--json {_render.JSON_CALLS}); a long journal is read from its end only")
    paging.add_argument("--all-calls", action="store_true",
                        help="list every effect call and count them all (reads the whole journal)")
    show.set_defaults(handler=_cmd_show)

    gc = sub.add_parser("gc", help="apply snapshot retention, delete unreferenced chunks, optionally compact")
    _common(gc)
    gc.add_argument("--compact", action="store_true",
                    help="also rewrite the store file without free space (needs exclusive access)")
    gc.set_defaults(handler=_cmd_gc)

    init = sub.add_parser("init", help="create a store (and its key file, if --key-file names one "
                          "that does not exist); a PostgreSQL store needs --key-file")
    _common(init)
    init.set_defaults(handler=_cmd_init)

    ui = sub.add_parser("ui", help="serve a web dashboard of the store's runs (needs tcc[ui]); "
                        "prints its URL, with the access token, on the first line")
    _common(ui)
    ui.add_argument("--host", default="127.0.0.1",
                    help="address to listen on (default 127.0.0.1; another needs --allow-remote)")
    ui.add_argument("--port", type=int, default=8765, help="port (default 8765; 0 picks a free one)")
    ui.add_argument("--allow-remote", action="store_true",
                    help="allow a --host other machines can reach (plain HTTP: put TLS in front)")
    ui.set_defaults(handler=_cmd_ui)

    _transfer.add_parsers(sub, _common)  # export, import
    info = sub.add_parser("info", help="show the interpreter tag and native-module status")
    info.set_defaults(handler=_cmd_info, json=False)
    return parser


def _open(args: argparse.Namespace, *, create: bool) -> Any:
    from ..store import open_store

    return open_store(args.store, tenant=args.tenant, create=create, durability=args.durability,
                      keep=default_keep())


def _cmd_init(args: argparse.Namespace) -> int:
    from ..store import init_store

    store, made = init_store(args.store, key_file=args.key_file, tenant=args.tenant)
    # the key file init_store used: --key-file, else $TCC_STORE_KEY_FILE (None: an LMDB store
    # without a key)
    key_file = args.key_file or os.environ.get("TCC_STORE_KEY_FILE") or None
    with store:
        doc = {"store": store.path, "key_file": key_file, "key_file_created": made}
    if args.json:
        import json

        print(json.dumps(doc))
    else:
        print(f"store {_render.clean(doc['store'])} is ready")
        if made:
            print(f"created the key file {key_file} (mode 0600): every process that uses the "
                  "store needs it (--key-file or $TCC_STORE_KEY_FILE); keep a copy somewhere safe, "
                  "since the store cannot be read without it")
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from .. import runtime

    with _open(args, create=True) as store:
        outcome = runtime.run(
            store, args.script, args.args, run_id=args.run_id, strategy=args.strategy,
            checkpoint_every=args.checkpoint_every, lease=args.lease, keep=args.keep,
            progress=_render.progress_printer(), wait_seconds=args.wait, verify=args.verify,
            on_started=lambda run, resumed: _render.started(run.run_id, resumed=resumed,
                                                            as_json=args.json),
            on_notice=lambda text: print(f"tcc: note: {_render.clean(text)}", file=sys.stderr),
            on_code_change=args.on_code_change,
        )
        return _render.outcome(outcome, as_json=args.json)


def _cmd_submit(args: argparse.Namespace) -> int:
    import json

    from .. import runtime

    with _open(args, create=True) as store:
        run = runtime.submit(
            store, args.script, args.args, run_id=args.run_id, strategy=args.strategy,
            checkpoint_every=args.checkpoint_every or runtime.default_snapshot_every(args.strategy),
            verify=args.verify, keep=args.keep, on_code_change=args.on_code_change)
        if args.json:
            print(json.dumps({"id": run.run_id, "status": run.status, "entry": run.entry,
                              "tenant": run.tenant, "store": store.path}))
        else:
            print(run.run_id)
    return 0


def _cmd_resume(args: argparse.Namespace) -> int:
    from .. import runtime

    with _open(args, create=False) as store:
        run = store.get_run(args.run_id)  # an unknown run: the error, without "resuming" first
        if run.status in FINAL_STATUSES:  # so is a finished one (resume refuses it)
            raise UsageError(f"run {args.run_id} is already {run.status}; there is nothing to resume")
        _render.started(args.run_id, resumed=True, as_json=args.json)
        outcome = runtime.resume(
            store, args.run_id, strategy=args.strategy, checkpoint_every=args.checkpoint_every,
            lease=args.lease, steal=args.steal, progress=_render.progress_printer(),
            wait_seconds=args.wait, code=args.code,
            on_notice=lambda text: print(f"tcc: note: {_render.clean(text)}", file=sys.stderr),
            claimed_epoch=args.claimed_epoch,
        )
        return _render.outcome(outcome, as_json=args.json)


def _cmd_retry(args: argparse.Namespace) -> int:
    from .. import runtime

    with _open(args, create=False) as store:
        runtime.check_retry(store, args.run_id)  # said before "resuming", as resume says its refusals
        _render.started(args.run_id, resumed=True, as_json=args.json)
        outcome = runtime.retry(store, args.run_id, lease=args.lease, code=args.code,
                                progress=_render.progress_printer(), wait_seconds=args.wait,
                                on_notice=lambda text: print(f"tcc: note: {_render.clean(text)}",
                                                             file=sys.stderr))
        return _render.outcome(outcome, as_json=args.json)


def _cmd_signal(args: argparse.Namespace) -> int:
    import json

    from .. import runtime
    from ..effects import check_signal_name

    try:
        json.loads(args.value)
    except ValueError as exc:
        raise UsageError(f"--value must be JSON: {exc}") from None
    try:
        check_signal_name(args.name)  # before any store is opened
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    with _open(args, create=False) as store:
        wait_id = runtime.signal(store, args.run_id, args.name, raw=args.value.encode())
        _render.delivered(args.run_id, wait_id, as_json=args.json)
    return 0


def _cmd_answer(args: argparse.Namespace) -> int:
    from .. import runtime

    with _open(args, create=False) as store:
        wait_id = runtime.answer(store, args.run_id, args.approved, args.comment)
        _render.delivered(args.run_id, wait_id, as_json=args.json)
    return 0


def _cmd_cancel(args: argparse.Namespace) -> int:
    from .. import runtime

    with _open(args, create=False) as store:
        done = runtime.cancel(store, args.run_id, reason=args.reason)
        _render.cancelled(done.run, done.was, done.children, as_json=args.json)
    return 0


def _cmd_upgrade(args: argparse.Namespace) -> int:
    from .. import runtime

    with _open(args, create=False) as store:
        plan = runtime.upgrade(store, args.run_id, dry_run=args.dry_run, sets=args.set,
                               renames=args.rename, steal=args.steal)
    return _render.upgrade_plan(plan, dry_run=args.dry_run, as_json=args.json)


def _cmd_fork(args: argparse.Namespace) -> int:
    import json

    from .. import runtime

    sets = {}
    for item in args.set:
        name, sep, raw = item.partition("=")
        if not sep or not name.isidentifier():
            raise UsageError(f"--set takes NAME=JSON, not {item!r}")
        try:
            sets[name] = json.loads(raw)
        except ValueError as exc:
            raise UsageError(f"--set {name}: the value must be JSON ({exc})") from None
    extra: dict[str, Any] = {}
    if args.answer is not None:
        try:
            extra["answer"] = json.loads(args.answer)
        except ValueError as exc:
            raise UsageError(f"--answer: the value must be JSON ({exc})") from None
    with _open(args, create=False) as store:
        child = runtime.fork(store, args.run_id, at=args.at, sets=sets, new_run_id=args.new_run_id,
                             **extra)
    if args.json:
        print(json.dumps({"id": child.run_id, "parent": args.run_id}))
    else:
        print(_render.clean(child.run_id))
    return 0


def _confirm_unsafe_repr(args: argparse.Namespace) -> None:
    """``--unsafe-repr`` unpickles for real: on a terminal the user types yes; elsewhere
    only ``--yes`` allows it (UsageError otherwise)."""
    if not args.unsafe_repr or args.yes:
        return
    if not sys.stdin.isatty():
        raise UsageError(
            "--unsafe-repr loads the snapshot with the real unpickler, which runs any code in "
            "it; stdin is not a terminal to confirm on, so pass --yes to allow it (only for a "
            "store you trust), or leave --unsafe-repr out for the safe view")
    print("tcc inspect --unsafe-repr loads the snapshot with the real unpickler and imports the "
          "run's script: any code in the snapshot runs, as you. Only do this with a store you "
          "trust.", file=sys.stderr)
    print("type yes to go on: ", end="", file=sys.stderr, flush=True)
    answer = sys.stdin.readline()
    if answer.strip().lower() != "yes":
        raise UsageError("--unsafe-repr was not confirmed; nothing was loaded")


def _cmd_inspect(args: argparse.Namespace) -> int:
    from ._inspect import inspect_command

    _confirm_unsafe_repr(args)
    with _open(args, create=False) as store:
        print(inspect_command(store, args.run_id, args.at, args.json, args.unsafe_repr))
    return 0


def _cmd_worker(args: argparse.Namespace) -> int:
    from .. import runtime
    from ..store import default_path, is_postgres_url

    path = args.store or default_path()
    # a PostgreSQL store exists once `tcc init` made it (opening it creates nothing unasked)
    new = not is_postgres_url(path) and not os.path.exists(os.path.join(os.path.abspath(path),
                                                                        "data.mdb"))
    poll = args.poll if args.poll is not None else 5.0 if is_postgres_url(path) else 1.0
    with _open_for_worker(args, poll) as store:
        if new:  # a worker may start before any run, but a mistyped path should not pass unseen
            print(f"tcc worker: there was no store at {_render.clean(path)}, so an empty one was created; "
                  "waiting for runs there (if you expected runs, check --store and $TCC_STORE)",
                  file=sys.stderr, flush=True)
        worker = runtime.Worker(
            store, concurrency=args.concurrency, poll=poll, lease=args.lease,
            log=lambda msg: print(_render.clean(msg), file=sys.stderr, flush=True),
        )
        return worker.serve(once=args.once)


def _open_for_worker(args: argparse.Namespace, poll: float) -> Any:
    """The worker's store.  A worker may start before its database does (a host booting, a
    deployment bringing both up): an unreachable server is waited for, said once, as an
    outage while it serves is; ``--once`` fails at once.  Any other error (no key, a wrong
    one, no store there) is said and ends the worker."""
    import time

    from ..errors import StoreConnectionError

    said = False
    while True:
        try:
            store = _open(args, create=True)
        except StoreConnectionError as exc:
            if args.once:
                raise
            if not said:
                print(f"tcc worker: {_render.clean(str(exc))}; retrying every {poll:g} s until "
                      "it answers", file=sys.stderr, flush=True)
                said = True
            time.sleep(poll)
            continue
        if said:
            print("tcc worker: the store is reachable", file=sys.stderr, flush=True)
        return store


def _cmd_ls(args: argparse.Namespace) -> int:
    with _open(args, create=False) as store:
        damaged: list[tuple[str, str]] = []
        runs = store.list_runs(args.status, damaged=damaged)
        _render.run_list(runs, as_json=args.json, code=_code_flags(store, runs))
    for run_id, why in damaged:  # list what is intact, then say what is not (exit 1)
        _render.say(f"tcc: error: run {run_id} is not listed: {why}", file=sys.stderr, newlines=False)
    return 1 if damaged else 0


def _code_flags(store: Any, runs: list[Any]) -> dict[str, str]:
    """For each unfinished run whose files changed since it recorded them: what a resume
    does about it (its ``--on-code-change`` policy), e.g. ``refuse``: it needs a decision."""
    from ..runtime import awaiting_decision, code_state
    from ..store import FINAL_STATUSES

    flags = {}
    for run in runs:
        if run.status in FINAL_STATUSES:
            continue
        try:
            events = store.events(run.run_id)
            state = code_state(events, run.status)
            if state is not None and state["changed"]:
                policy = state["policy"]
                # under refuse, a run already on its recorded code has had its decision
                flags[run.run_id] = "pinned" if policy == "refuse" and not awaiting_decision(events) \
                    else policy
        except Exception:  # noqa: BLE001 - advisory: a damaged trail is said by `tcc show`
            continue
    return flags


def _cmd_show(args: argparse.Namespace) -> int:
    if args.calls is not None and args.calls < 0:
        raise UsageError(f"--calls must be at least 0, not {args.calls}")
    calls = None if args.all_calls else -1 if args.calls is None else args.calls
    with _open(args, create=False) as store:
        _render.run_detail(store, args.run_id, as_json=args.json, calls=calls)
    return 0


def _cmd_gc(args: argparse.Namespace) -> int:
    with _open(args, create=False) as store:
        stats = store.gc()
        if args.compact:
            sizes = store.compact()  # byte sizes only: keep what gc deleted
            stats = dataclasses.replace(stats, bytes_before=sizes.bytes_before,
                                        bytes_after=sizes.bytes_after)
    doc = {
        "snapshots_deleted": stats.snapshots_deleted, "chunks_deleted": stats.chunks_deleted,
        "bytes_before": stats.bytes_before, "bytes_after": stats.bytes_after,
    }
    if args.json:
        import json

        print(json.dumps(doc))
    else:
        print(" ".join(f"{k}={v}" for k, v in doc.items()))
    return 0


def _cmd_ui(args: argparse.Namespace) -> int:
    from . import ui

    missing = ui.missing_extra()
    if missing:
        raise TccError(missing)
    ui.check_listen(args.host, args.port, args.allow_remote)  # before any store is opened
    with _open(args, create=False) as store:
        return ui.serve(store, host=args.host, port=args.port, allow_remote=args.allow_remote)


def _cmd_info(args: argparse.Namespace) -> int:
    from .. import capture

    print(f"tcc {_version.__version__}")
    print(f"interpreter tag: {capture.interpreter_tag().decode()}")
    native = "available" if capture.native_available() else "NOT available (replay only)"
    print(f"native frame module: {native}")
    from ..store import default_path, redact_url

    print(f"default store: {_render.clean(redact_url(default_path()))}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tcc`` console script."""
    code = _main(argv)
    if argv is None:
        # A run that stopped abnormally leaves its coroutine suspended; letting
        # the interpreter finalise it would run the agent's `finally` blocks in
        # a process that no longer owns the run.  The state is durable, so
        # leave without finalisers -- and without atexit handlers, so hand the
        # spans a batching tracer provider still holds to its exporter first.
        from ..runtime import flush_tracing

        flush_tracing(timeout_ms=5000)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


_python_show_warning = warnings.showwarning


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: Any = None, line: str | None = None) -> None:
    """tcc's own warnings as one ``tcc: warning: ...`` line; others as Python shows them."""
    if category.__module__.startswith("tcc."):  # e.g. StoreSecurityWarning
        text = _render.clean(message, newlines=True)
        print(f"tcc: {text}" if text.startswith("warning:") else f"tcc: warning: {text}",
              file=file or sys.stderr)
        return
    _python_show_warning(message, category, filename, lineno, file, line)


def _main(argv: Sequence[str] | None) -> int:
    warnings.showwarning = _show_warning
    words = sys.argv[1:] if argv is None else list(argv)
    parser = _parser(_command_of(words))
    args = parser.parse_args(words)
    if getattr(args, "command", None) in ("run", "resume"):
        import signal

        from ..runtime import STOP

        # SIGTERM (a redeploy, `tcc worker` shutting down): stop after the
        # current commit instead of dying in the middle of an effect.
        signal.signal(signal.SIGTERM, lambda *_: STOP.set())
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        _check_args(args)
        key_file = getattr(args, "key_file", None)
        if key_file and args.command != "init":
            # as $TCC_STORE_KEY_FILE, so that the runs this command starts (tcc worker's
            # resumes) are given the key too
            os.environ["TCC_STORE_KEY_FILE"] = os.path.abspath(key_file)
        return int(handler(args))
    except UsageError as exc:
        if args.debug:
            raise
        print(f"tcc: error: {_render.clean(exc)}", file=sys.stderr)
        return 2
    except TccError as exc:
        if args.debug:
            raise
        print(f"tcc: error: {_render.clean(exc)}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `tcc show RUN | head`: the reader left; not an error
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 0
    except KeyboardInterrupt:
        print("tcc: interrupted; the run can be resumed with `tcc resume`", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - a bug in tcc: one line, traceback on --debug
        if args.debug:
            raise
        print(f"tcc: internal error ({type(exc).__name__}: {_render.clean(exc)}); "
              "please report it, with the output of the same command run with --debug",
              file=sys.stderr)
        return 1
