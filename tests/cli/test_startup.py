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


_AGENT = '''
import json, os, signal, sys
import tcc

@tcc.effect
async def step(i):
    marker = os.environ["MARK"]
    if i == 1 and not os.path.exists(marker):  # the first process dies inside step 1
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    if i == 1:  # the resumed process's first new effect: what has it imported so far?
        with open(marker, "w") as fh:
            json.dump(sorted(sys.modules), fh)
    return i * 10

async def main():
    total = 0
    for i in range(3):
        total += await step(i)
    return total
'''

_HEAVY = ("cloudpickle", "greenlet", "tcc.capture._pickler", "tcc.capture._diagnose")


def _crash_and_resume(tmp_path, source):
    """Run ``source`` with `tcc run` until it is killed inside step 1, resume it with
    `tcc resume` to the end, and return the modules the resumed process had imported at
    its first new effect."""
    script = tmp_path / "agent.py"
    script.write_text(source)
    mark = tmp_path / "mark"
    env = {**__import__("os").environ, "TCC_STORE": str(tmp_path / "store"), "MARK": str(mark)}
    first = subprocess.run([sys.executable, "-m", "tcc", "run", "--run-id", "r", str(script)],
                           env=env, capture_output=True, text=True, timeout=120)
    assert first.returncode == -9, first.stderr  # killed inside step 1
    second = subprocess.run([sys.executable, "-m", "tcc", "resume", "--json", "r"],
                            env=env, capture_output=True, text=True, timeout=120)
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout)["result"] == 30  # 0 + 10 + 20: nothing lost or run twice
    return set(json.loads(mark.read_text()))


def test_resume_reaches_its_first_new_effect_without_the_pickler(tmp_path):
    """A resumed run restores its snapshot with pickle's loader; the pickler (cloudpickle,
    ~14 ms of imports) and greenlet (plain-``def`` agents only) are imported when first
    needed, after the first new effect.  The run then checkpoints and finishes as usual."""
    loaded = _crash_and_resume(tmp_path, _AGENT)
    assert "tcc.runtime._driver" in loaded and "tcc.capture._api" in loaded
    assert loaded.isdisjoint(_HEAVY), sorted(loaded.intersection(_HEAVY))


# What a run whose effects are plain ``def`` functions never needs before its first new
# effect: asyncio (and with it ssl, socket, subprocess, concurrent.futures, logging: ~40 ms),
# the pickler, the run views of `tcc show` (datetime), and shutil (argparse's help width).
_NOT_FOR_SYNC = _HEAVY + ("asyncio", "ssl", "socket", "subprocess", "concurrent.futures", "logging",
                          "shutil", "datetime", "tcc.runtime._views", "tcc.runtime._fork")


def test_a_run_of_sync_effects_resumes_without_asyncio(tmp_path):
    """The drive makes its event loop when an async effect, a timeout or a gather first
    needs one: a run of plain ``def`` effects is resumed, re-issues its in-flight call and
    finishes without importing asyncio."""
    loaded = _crash_and_resume(tmp_path, _AGENT.replace("async def step(i):", "def step(i):"))
    assert "tcc.runtime._driver" in loaded and "tcc.store._lmdb" in loaded
    assert loaded.isdisjoint(_NOT_FOR_SYNC), sorted(loaded.intersection(_NOT_FOR_SYNC))


def test_reading_commands_import_no_pickler(tmp_path):
    """`tcc ls` and `tcc show` read runs; they never pickle, so they never import the pickler."""
    store = tmp_path / "store"
    script = tmp_path / "agent.py"
    script.write_text(_AGENT.replace("if i == 1 and", "if False and"))
    env = {**__import__("os").environ, "TCC_STORE": str(store), "MARK": str(tmp_path / "mark")}
    done = subprocess.run([sys.executable, "-m", "tcc", "run", "--run-id", "r", str(script)],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    for argv in (["ls"], ["show", "r"], ["show", "--json", "r"]):
        code = ("import sys, json; from tcc.cli._main import main\n"
                f"rc = main({argv!r})\n"
                f"print(json.dumps([rc, sorted(m for m in {_HEAVY!r} if m in sys.modules)]), file=sys.stderr)\n")
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                             timeout=120)
        rc, heavy = json.loads(out.stderr.strip().splitlines()[-1])
        assert (rc, heavy) == (0, []), (argv, out.stdout, out.stderr)
        assert "r" in out.stdout
