"""What a `tcc` command pays before it starts working: only its own parser is built, and
`tcc resume` imports no machinery it does not use before the run's first new effect."""

from __future__ import annotations

import json
import subprocess
import sys

from tcc.cli import _main


def test_every_command_is_known_to_the_fast_path():
    """`tcc COMMAND` builds only COMMAND's parser, so the list of commands it recognises
    must be the parser's own: a command missing from it would still work (the full parser
    is built), but one listed that does not exist would be refused with a wrong message."""
    parser = _main._parser()
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    assert tuple(sub.choices) == _main.COMMANDS


def test_a_command_builds_only_its_own_parser():
    parser = _main._parser("resume")
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    assert list(sub.choices) == ["resume"]
    args = parser.parse_args(["resume", "--steal", "r1"])
    assert (args.command, args.run_id, args.steal) == ("resume", "r1", True)
    assert _main._command_of(["--debug", "resume", "r1"]) == "resume"
    assert _main._command_of(["--debug"]) is None
    assert _main._command_of(["bogus", "resume"]) is None  # argparse names the bad command


def test_options_of_other_commands_are_still_refused(tmp_path):
    out = subprocess.run([sys.executable, "-m", "tcc", "resume", "--status", "x", "r1"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "unrecognized arguments: --status" in out.stderr


def test_resume_imports_no_dashboard_inspect_or_tracing_machinery(tmp_path):
    """The modules `tcc resume` needs are imported; the ones only other commands use
    (the dashboard, inspect's restricted loader and stack rendering, OpenTelemetry,
    the PostgreSQL driver) are not."""
    code = ("import sys, json; from tcc.cli import _main\n"
            "_main._parser(_main._command_of(['resume', 'r']))\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith(('tcc', 'starlette', "
            "'uvicorn', 'opentelemetry', 'psycopg')))))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    loaded = set(json.loads(out.stdout))
    assert {"tcc.runtime._driver", "tcc.store._lmdb", "tcc.capture._api"} <= loaded
    unwanted = {m for m in loaded if m.startswith(("starlette", "uvicorn", "opentelemetry", "psycopg",
                                                   "tcc.cli.ui", "tcc.cli._inspect", "tcc.cli._stack",
                                                   "tcc.cli._safe_repr", "tcc.capture._safeload",
                                                   "tcc.capture._allowlist", "tcc.store._postgres"))}
    assert unwanted == set()


def test_the_lazy_names_of_capture_are_there_when_asked_for():
    code = ("import sys, tcc.capture as c\n"
            "assert 'tcc.capture._safeload' not in sys.modules\n"
            "assert c.safe_loads.__module__ == 'tcc.capture._safeload'\n"
            "assert c.ViewRepr.__name__ == 'ViewRepr' and c.UNBOUND is c.UNBOUND\n"
            "from tcc.capture import FrameView, stub_name\n"
            "try:\n    c.no_such_name\nexcept AttributeError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "has no attribute 'no_such_name'" in out.stdout
