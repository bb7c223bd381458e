"""`tcc upgrade` (issue 22, part 2): a suspended run moves onto the edited code.

Each test crashes (SIGKILL right after a committed step) or parks a real run, edits its
files, upgrades it in a new process and resumes it in another; the expected result is
what the *new* code gives from the point where the old one stopped, derived in the test
from the steps the old code had completed.  A refused upgrade writes nothing: the run
stays as it was.
"""

from __future__ import annotations

import json
import pathlib
import textwrap

import pytest
from tests._support.runs import Cli


def _write(tmp: pathlib.Path, source: str, name: str = "agent.py") -> pathlib.Path:
    folder = tmp / "project"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(textwrap.dedent(source))
    return path


def _killed(cli: Cli, run_id: str, script: pathlib.Path, *args: str, after: int) -> None:
    killer = Cli.__new__(Cli)
    killer.store, killer.env = cli.store, dict(cli.env, TCC_TEST_KILL_AFTER=str(after))
    proc = killer.run("run", "--run-id", run_id, str(script), *args)
    assert proc.returncode == -9, (proc.returncode, proc.stderr)
    assert cli.show(run_id)["status"] == "running"


def _result(proc) -> object:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)["result"]


def _upgraded(cli: Cli, run_id: str, *options: str) -> dict:
    """Dry run, then the upgrade; both must agree and succeed.  The plan (JSON)."""
    dry = cli.run("upgrade", "--json", "--dry-run", *options, run_id)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    plan = json.loads(dry.stdout)
    assert plan["ok"] and plan["written"] is None
    snapshots = cli.show(run_id)["snapshots"]
    assert cli.show(run_id)["snapshots"] == snapshots  # a dry run wrote nothing
    done = cli.run("upgrade", "--json", *options, run_id)
    assert done.returncode == 0, done.stdout + done.stderr
    applied = json.loads(done.stdout)
    assert applied["ok"] and applied["written"] is not None
    assert [f["new_line"] for f in applied["frames"]] == [f["new_line"] for f in plan["frames"]]
    return applied


def _refused(cli: Cli, run_id: str, *options: str) -> str:
    """The upgrade is refused, says why, and writes nothing."""
    before = cli.show(run_id)
    proc = cli.run("upgrade", *options, run_id)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "REFUSED" in proc.stdout and "nothing was written" in proc.stdout
    after = cli.show(run_id)
    assert (after["epoch"], after["snapshots"], after["status"]) == \
        (before["epoch"], before["snapshots"], before["status"])
    return proc.stdout


LOOP = """\
import tcc


@tcc.effect
def step(i):
    return i


async def main():
    out = []
    total = 0
    for i in range(6):
        v = await step(i)
        total += v
        out.append(v)
    return out, total
"""
# Killed after its 2nd step: i = 0 is done (out = [0], total = 0), and the frame waits at
# `await step(i)` for i = 1, whose answer (1) a resume sends into it.


def test_a_bug_fix_after_the_await_continues_on_the_new_code(tmp_path):
    cli = Cli(tmp_path)
    script = _write(tmp_path, LOOP)
    _killed(cli, "fix", script, after=2)
    script.write_text(LOOP.replace("total += v\n", "total += v * 2\n")
                      .replace("out.append(v)", "out.append(v + 1)"))
    dry = cli.run("upgrade", "--dry-run", "fix")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "main()  agent.py: line 13 -> 13  at `await step(i)` (line 13)" in dry.stdout, dry.stdout
    assert "kept:" in dry.stdout and "out, total, i, v" in dry.stdout
    assert "nothing was written (--dry-run)" in dry.stdout
    plan = _upgraded(cli, "fix")
    assert [e["kind"] for e in cli.show("fix")["events"]].count("upgraded") == 1
    assert plan["frames"][0]["old_line"] == 13
    got = _result(cli.run("resume", "--json", "fix"))
    assert got == [[0] + [v + 1 for v in range(1, 6)], 0 + sum(2 * v for v in range(1, 6))]


def test_a_statement_added_before_the_await_maps_by_the_await_site(tmp_path):
    cli = Cli(tmp_path)
    script = _write(tmp_path, LOOP)
    _killed(cli, "added", script, after=2)
    script.write_text(LOOP.replace("    for i in range(6):\n",
                                   "    print('looping')\n    for i in range(6):\n")
                      .replace("        v = await step(i)\n", "        total += 100\n        v = await step(i)\n"))
    plan = _upgraded(cli, "added")
    assert (plan["frames"][0]["old_line"], plan["frames"][0]["new_line"]) == (13, 15)
    got = _result(cli.run("resume", "--json", "added"))
    # i = 1 resumes after its `total += 100` would have run: only i = 2..5 add it
    assert got == [list(range(6)), 1 + sum(100 + i for i in range(2, 6))]


def test_a_new_local_read_after_the_await_needs_set(tmp_path):
    cli = Cli(tmp_path)
    script = _write(tmp_path, LOOP)
    _killed(cli, "scale", script, after=2)
    script.write_text(LOOP.replace("        v = await step(i)\n",
                                   "        scale = i % 2 + 1\n        v = await step(i)\n")
                      .replace("total += v\n", "total += v * scale\n"))
    said = _refused(cli, "scale")
    assert "new local 'scale' is read at line 15" in said and "--set scale=JSON" in said, said
    plan = _upgraded(cli, "scale", "--set", "scale=5")
    assert plan["frames"][0]["given"] == ["scale"]
    got = _result(cli.run("resume", "--json", "scale"))
    assert got == [list(range(6)), 1 * 5 + sum(i * (i % 2 + 1) for i in range(2, 6))]


def test_a_renamed_local_is_refused_unless_mapped(tmp_path):
    cli = Cli(tmp_path)
    script = _write(tmp_path, LOOP)
    _killed(cli, "ren", script, after=2)
    script.write_text(LOOP.replace("total", "acc"))
    said = _refused(cli, "ren")
    assert "new local 'acc'" in said and "--rename OLD=acc" in said and "total" in said, said
    plan = _upgraded(cli, "ren", "--rename", "total=acc")
    assert plan["frames"][0]["renamed"] == ["total -> acc"]
    assert _result(cli.run("resume", "--json", "ren")) == [list(range(6)), 15]


def test_a_removed_local_is_dropped_and_said(tmp_path):
    cli = Cli(tmp_path)
    old = LOOP.replace("        out.append(v)\n", "        last = v\n        out.append(last)\n")
    script = _write(tmp_path, old)
    _killed(cli, "drop", script, after=2)
    script.write_text(LOOP)
    dry = cli.run("upgrade", "--dry-run", "drop")
    assert "dropped:" in dry.stdout and "last" in dry.stdout, dry.stdout
    plan = _upgraded(cli, "drop")
    assert plan["frames"][0]["dropped"] == ["last"]
    assert _result(cli.run("resume", "--json", "drop")) == [list(range(6)), 15]


def test_an_await_in_a_for_loop_over_a_list_with_its_body_changed(tmp_path):
    source = """\
    import tcc


    @tcc.effect
    def ask(x):
        return x * 2


    async def main():
        items = [3, 1, 4, 1, 5]
        out = []
        for x in items:
            out.append(await ask(x))
        return out
    """
    cli = Cli(tmp_path)
    script = _write(tmp_path, source)
    _killed(cli, "list", script, after=3)  # items 3, 1 done; waiting for ask(4)
    script.write_text(textwrap.dedent(source).replace(
        "        out.append(await ask(x))\n",
        "        out.append(await ask(x))\n        out.append(-x)\n"))
    _upgraded(cli, "list")
    assert _result(cli.run("resume", "--json", "list")) == [6, 2, 8, -4, 2, -1, 10, -5]


def test_an_await_inside_try_and_with(tmp_path):
    source = """\
    import contextlib

    import tcc


    @tcc.effect
    def step(i):
        return i


    async def main():
        out = []
        for i in range(4):
            try:
                with contextlib.nullcontext(i) as c:
                    v = await step(c)
            except ValueError:
                v = -1
            out.append(v)
        return out
    """
    cli = Cli(tmp_path)
    script = _write(tmp_path, source)
    _killed(cli, "with", script, after=2)
    script.write_text(textwrap.dedent(source).replace("out.append(v)", "out.append(v * 3)"))
    plan = _upgraded(cli, "with")
    stack = plan["frames"][0]["stack"]
    # (3.11/3.12 point at the statement, 3.13 at its expression)
    assert "the iterator of `" in stack and "range(4)" in stack, stack
    assert "the exit of `" in stack and "contextlib.nullcontext(i)" in stack, stack
    assert _result(cli.run("resume", "--json", "with")) == [0, 3, 6, 9]


def test_a_changed_with_block_around_the_await_is_refused_naming_it(tmp_path):
    source = """\
    import contextlib

    import tcc


    @tcc.effect
    def step(i):
        return i


    async def main():
        out = []
        for i in range(4):
            with contextlib.nullcontext(i) as c:
                out.append(await step(c))
        return out
    """
    cli = Cli(tmp_path)
    script = _write(tmp_path, source)
    _killed(cli, "cm", script, after=2)
    script.write_text(textwrap.dedent(source).replace("contextlib.nullcontext(i) as c",
                                                      "contextlib.suppress(KeyError)"))
    said = _refused(cli, "cm")
    assert "line 15" in said, said


SITES = """\
import tcc


@tcc.effect
def step(i):
    return i


async def main():
    out = []
{label}    for i in range(4):
        out.append(await step(i))
    return out
"""
# the same await, written the same way, added before the loop
SECOND = "    i = 100\n    out.append(await step(i))\n"


def test_a_second_identical_await_site_is_ambiguous_unless_labelled(tmp_path):
    cli = Cli(tmp_path)
    script = _write(tmp_path, SITES.format(label=""))
    _killed(cli, "amb", script, after=2)
    script.write_text(SITES.format(label=SECOND))
    said = _refused(cli, "amb")
    assert "is ambiguous" in said and "tcc.checkpoint" in said, said

    labelled = tmp_path / "labelled"
    cli2 = Cli(labelled)
    script2 = _write(labelled, SITES.format(label='    await tcc.checkpoint("loop")\n'))
    _killed(cli2, "lab", script2, after=2)
    script2.write_text(SITES.format(label=SECOND + '    await tcc.checkpoint("loop")\n'))
    plan = _upgraded(cli2, "lab")
    assert "after checkpoint 'loop'" in plan["frames"][0]["site"]
    assert _result(cli2.run("resume", "--json", "lab")) == [0, 1, 2, 3]


def test_a_removed_suspension_point_is_refused_naming_the_line(tmp_path):
    cli = Cli(tmp_path)
    script = _write(tmp_path, LOOP)
    _killed(cli, "gone", script, after=2)
    script.write_text(LOOP.replace("v = await step(i)", "v = i"))
    said = _refused(cli, "gone")
    assert "`await step(i)` (line 13) has no counterpart in the new code" in said, said
    # and nothing changed: the run still resumes on its recorded code
    assert _result(cli.run("resume", "--json", "--code", "pinned", "gone")) == [list(range(6)), 15]


def test_a_changed_function_deep_in_a_three_frame_chain(tmp_path):
    source = """\
    import tcc


    @tcc.effect
    def step(i):
        return i


    async def leaf(i):
        v = await step(i)
        return v + 1


    async def middle(i):
        return await leaf(i) * 2


    async def main():
        out = []
        for i in range(4):
            out.append(await middle(i))
        return out
    """
    cli = Cli(tmp_path)
    script = _write(tmp_path, source)
    _killed(cli, "deep", script, after=2)
    script.write_text(textwrap.dedent(source).replace("return v + 1", "return v + 1000"))
    plan = _upgraded(cli, "deep")
    changed = {f["qualname"]: f["changed"] for f in plan["frames"] if not f["internal"]}
    assert changed == {"main": False, "middle": False, "leaf": True}, plan["frames"]
    assert _result(cli.run("resume", "--json", "deep")) == [2, 2002, 2004, 2006]


def test_a_changed_helper_module_next_to_the_script(tmp_path):
    helper = """\
    import tcc


    @tcc.effect
    def step(i):
        return i


    async def fetch(i):
        v = await step(i)
        return v + 1
    """
    cli = Cli(tmp_path)
    _write(tmp_path, helper, "tools.py")
    script = _write(tmp_path, """\
    import tools


    async def main():
        return [await tools.fetch(i) for i in range(4)]
    """)
    _killed(cli, "mod", script, after=2)
    (script.parent / "tools.py").write_text(textwrap.dedent(helper).replace("v + 1", "v + 50"))
    plan = _upgraded(cli, "mod")
    assert [f["file"].endswith("tools.py") for f in plan["frames"] if f["changed"]] == [True]
    assert _result(cli.run("resume", "--json", "mod")) == [1, 51, 52, 53]


STATE = """\
import dataclasses

import tcc


@dataclasses.dataclass
class State:
    n: int = 0


@tcc.effect
def step(i):
    return i


async def main():
    s = State()
    for i in range(4):
        v = await step(i)
        s.n += v
    return s.n
"""


def test_a_dataclass_that_gains_a_field_gets_its_default(tmp_path):
    cli = Cli(tmp_path)
    script = _write(tmp_path, STATE)
    _killed(cli, "dc", script, after=2)
    script.write_text(STATE.replace("    n: int = 0\n", "    n: int = 0\n    priority: int = 7\n")
                      .replace("s.n += v\n", "s.n += v + s.priority\n"))
    plan = _upgraded(cli, "dc")
    assert any("State.priority" in d for d in plan["defaults"]), plan
    assert _result(cli.run("resume", "--json", "dc")) == 0 + sum(i + 7 for i in range(1, 4))


def test_a_dataclass_field_without_a_default_is_refused_naming_it(tmp_path):
    cli = Cli(tmp_path)
    script = _write(tmp_path, STATE)
    _killed(cli, "nodef", script, after=2)
    script.write_text(STATE.replace("    n: int = 0\n", "    priority: int\n    n: int = 0\n")
                      .replace("s = State()", "s = State(1)"))
    said = _refused(cli, "nodef")
    assert "class agent.State has a new field 'priority' without a default" in said, said


def test_a_pydantic_model_that_gains_a_field_gets_its_default(tmp_path):
    pytest.importorskip("pydantic")
    source = STATE.replace("import dataclasses\n", "import pydantic\n").replace(
        "@dataclasses.dataclass\nclass State:", "class State(pydantic.BaseModel):")
    cli = Cli(tmp_path)
    script = _write(tmp_path, source)
    _killed(cli, "pyd", script, after=2)
    script.write_text(source.replace("    n: int = 0\n", "    n: int = 0\n    priority: int = 7\n")
                      .replace("s.n += v\n", "s.n += v + s.priority\n"))
    plan = _upgraded(cli, "pyd")
    assert any("State.priority" in d for d in plan["defaults"]), plan
    assert _result(cli.run("resume", "--json", "pyd")) == sum(i + 7 for i in range(1, 4))


def test_a_parked_run_is_upgraded_then_approved(tmp_path):
    source = """\
    import tcc


    async def main():
        ok = await tcc.approval("ship it?")
        return "shipped" if ok else "held"
    """
    cli = Cli(tmp_path)
    script = _write(tmp_path, source)
    parked = cli.run("run", "--run-id", "park", str(script))
    assert parked.returncode == 0 and cli.show("park")["status"] == "waiting", parked.stderr
    script.write_text(textwrap.dedent(source).replace('"shipped" if ok', '"shipped v2" if ok'))
    _upgraded(cli, "park")
    assert cli.show("park")["status"] == "waiting"
    assert cli.run("approve", "park").returncode == 0
    assert _result(cli.run("resume", "--json", "park")) == "shipped v2"


def test_inspect_after_an_upgrade_shows_the_new_lines(tmp_path):
    cli = Cli(tmp_path)
    script = _write(tmp_path, LOOP)
    _killed(cli, "insp", script, after=2)
    script.write_text(LOOP.replace("    out = []\n", "    out = []\n    print('two new')\n    print('lines')\n"))
    _upgraded(cli, "insp")
    shown = cli.run("inspect", "insp")
    assert shown.returncode == 0, shown.stderr
    assert "line 15" in shown.stdout and "v = await step(i)" in shown.stdout, shown.stdout
    assert "code changed" not in shown.stdout


def test_a_change_off_the_stack_moves_the_run_onto_the_current_code(tmp_path):
    """Only a helper that no suspended frame runs changed: the upgrade records the current
    code, and the default policy stops pinning the run."""
    source = LOOP.replace("        out.append(v)\n", "        out.append(shape(v))\n") + \
        "\n\ndef shape(v):\n    return v\n"
    cli = Cli(tmp_path)
    script = _write(tmp_path, source)
    _killed(cli, "off", script, after=2)
    script.write_text(source.replace("    return v\n", "    return -v\n"))
    proc = cli.run("upgrade", "off")
    assert proc.returncode == 0 and "no suspended frame's code changed" in proc.stdout, proc.stdout
    assert cli.show("off")["code"]["changed"] == []
    got = cli.run("resume", "--json", "off")
    assert "continues on the code it recorded" not in got.stderr
    assert _result(got) == [[0, -1, -2, -3, -4, -5], 15]


def test_swapped_awaits_of_one_call_map_by_what_they_await(tmp_path):
    source = """\
    import tcc


    @tcc.effect
    def step(s):
        return s.upper()


    async def main():
        x = y = ""
        x = await step("a")
        y = await step("b")
        return [x, y]
    """
    cli = Cli(tmp_path)
    script = _write(tmp_path, source)
    _killed(cli, "swap", script, after=2)  # waits at step("b")
    text = textwrap.dedent(source)
    swapped = text.replace('    x = await step("a")\n    y = await step("b")\n',
                           '    y = await step("b")\n    x = await step("a")\n')
    assert swapped != text
    script.write_text(swapped)
    plan = _upgraded(cli, "swap")
    assert (plan["frames"][0]["old_line"], plan["frames"][0]["new_line"]) == (12, 11)
    # "b" goes to y, and the new code then asks step("a") again (a new call): A, B
    assert _result(cli.run("resume", "--json", "swap")) == ["A", "B"]


def test_a_changed_nested_function_the_run_holds_is_refused(tmp_path):
    source = """\
    import tcc


    @tcc.effect
    def step(i):
        return i


    async def main():
        async def helper(x):
            r = await step(x)
            return r

        out = []
        for i in range(4):
            out.append(await helper(i))
        return out
    """
    cli = Cli(tmp_path)
    script = _write(tmp_path, source)
    _killed(cli, "nest", script, after=2)
    script.write_text(textwrap.dedent(source).replace("return r\n", "return r * 10\n"))
    said = _refused(cli, "nest")
    assert "nested function main.<locals>.helper() changed" in said, said


def test_a_call_in_flight_is_refused(tmp_path):
    cli = Cli(tmp_path)
    script = _write(tmp_path, LOOP)

    inflight = LOOP.replace("def step(i):\n    return i\n",
                            "def step(i):\n    if i == 2:\n        import os, signal\n"
                            "        os.kill(os.getpid(), signal.SIGKILL)\n    return i\n")
    script.write_text(inflight)
    proc = cli.run("run", "--run-id", "fly", str(script))
    assert proc.returncode == -9
    script.write_text(inflight.replace("total += v\n", "total += v * 2\n"))
    said = _refused(cli, "fly")
    assert "journal record(s) after its newest snapshot" in said, said


def test_an_await_in_an_except_clause_whose_exception_type_changed_is_refused(tmp_path):
    source = """\
    import tcc


    @tcc.effect
    def step(i):
        return i


    async def main():
        out = []
        for i in range(4):
            try:
                raise ValueError(i)
            except ValueError:
                out.append(await step(i))
        return out
    """
    cli = Cli(tmp_path)
    script = _write(tmp_path, source)
    _killed(cli, "exc", script, after=2)
    text = textwrap.dedent(source)
    script.write_text(text.replace("raise ValueError(i)", "raise KeyError(i)")
                      .replace("except ValueError:", "except KeyError:"))
    said = _refused(cli, "exc")
    assert "inside `except` clause(s) catching ValueError" in said and "catch KeyError" in said, said
    # the handler's body alone changed: that maps
    script.write_text(text.replace("out.append(await step(i))", "out.append(await step(i) * 2)"))
    _upgraded(cli, "exc")
    assert _result(cli.run("resume", "--json", "exc")) == [0, 2, 4, 6]


def test_an_upgraded_fork_nobody_started_stays_unstarted(tmp_path):
    """`tcc upgrade` claims a fork to rewrite its snapshot, moving it past epoch 1, but runs
    none of it: a worker used to take the upgraded fork for a run whose owner died and ran its
    what-if effects on the real world.  It stays a fork nobody started until `tcc resume`."""
    source = """\
    import pathlib
    import tcc

    LEDGER = pathlib.Path(__file__).with_name("ledger.txt")


    @tcc.effect
    async def act(what):
        with LEDGER.open("a") as f:
            f.write(what + "\\n")
        return "did " + what


    async def main():
        answer = await act("question")
        await tcc.checkpoint()
        extra = await act(f"follow-up to {answer}")
        return [answer, extra]
    """
    cli = Cli(tmp_path)
    script = _write(tmp_path, source)
    ledger = script.with_name("ledger.txt")
    assert cli.run("run", "--run-id", "p", str(script)).returncode == 0
    first = cli.show("p")["snapshots"][0]["number"]  # after the first effect
    cli.run("fork", "p", "--at", str(first), "--answer", '"what-if"', "--run-id", "f", check=True)
    script.write_text(textwrap.dedent(source).replace("return [answer, extra]", "return [answer, extra, 2]"))
    _upgraded(cli, "f")
    shown = cli.show("f")
    assert shown["epoch"] > 1 and shown["unstarted_fork"] is True, shown
    assert "a fork nobody started: `tcc resume f` starts it" in cli.run("show", "f", check=True).stdout
    calls = ledger.read_text()
    worker = cli.run("worker", "--once", check=True)
    assert "resuming f" not in worker.stderr, worker.stderr
    assert ledger.read_text() == calls and cli.show("f")["status"] == "running"
    assert _result(cli.run("resume", "--json", "f")) == ["what-if", "did follow-up to what-if", 2]
    assert ledger.read_text() == calls + "follow-up to what-if\n"
