"""`tcc upgrade` under random edits: it writes suspended frames (instruction offset, value
stack, locals) into code objects the run never executed, so a wrong mapping would not
raise an exception -- it would crash the interpreter when the frame is resumed.

For each seed, a handful of variants: a small agent (its await directly in a loop, in a
``try`` body, in an ``except`` handler, in a ``with`` block, in a nested helper coroutine,
or after a labelled checkpoint) is SIGKILLed after a random number of steps; its source is
then edited at random (statements inserted around the await, a constant changed, a local
renamed / dropped / added / closed over, an await added / removed / moved into an
expression, the loop body wrapped in an ``if``, the loop iterable changed, labelled
checkpoints inserted), and ``tcc upgrade`` moves the run onto the edited code.

What it proves, for every variant whose edited source compiles:

* ``tcc upgrade --json`` (with its ``--set``/``--rename`` now and then, and sometimes a
  ``--dry-run`` first) never crashes: exit 0 (``ok``) or 1 (refused, with reasons), a JSON
  plan either way; a dry run writes nothing, and what it refuses the real one refuses alike;
* an applied upgrade resumes on the new code (not the recorded one) without crashing: the
  run completes, or fails cleanly (exit 1 or 2 with a message) -- never a signal, an
  "internal error" or a traceback;
* a refused upgrade writes nothing: the run is still "running" on its old snapshot, a
  ``tcc resume --code current`` still refuses the changed code cleanly, and a plain
  ``tcc resume`` (which continues on the recorded code by default) ends it with the result
  of the unedited agent.

Every failure message names the seed, the variant, and the source before and after.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import random
import re
import subprocess

import pytest
from tests._support.runs import Cli

SEEDS = (11, 23, 47)
VARIANTS_PER_SEED = 7

HEADER = '''\
import contextlib
import tcc


@tcc.effect
def step(i):
    return i


'''

LOOP_HEAD = '''\
async def main():
    out = []
    total = 0
    for i in range(6):
'''

TAIL = '''\
        total += v * 1
        out.append(v)
    return out, total
'''

# the agent's main(), by where its await sits; each awaits `step` 6 times (and "labelled"
# passes one checkpoint before), so a kill after 1..4 steps leaves the run suspended
SHAPES = {
    "plain": LOOP_HEAD + "        v = await step(i)\n" + TAIL,
    "try": LOOP_HEAD + '''\
        try:
            v = await step(i)
        except ValueError:
            v = -1
''' + TAIL,
    "except": LOOP_HEAD + '''\
        try:
            raise ValueError(i)
        except ValueError:
            v = await step(i)
''' + TAIL,
    "with": LOOP_HEAD + '''\
        with contextlib.nullcontext():
            v = await step(i)
''' + TAIL,
    "helper": '''\
async def main():
    async def helper(x):
        r = await step(x)
        return r

    out = []
    total = 0
    for i in range(6):
        v = await helper(i)
''' + TAIL,
    "labelled": LOOP_HEAD.replace("    for i", '    await tcc.checkpoint("loop")\n    for i')
    + "        v = await step(i)\n" + TAIL,
}


BASE_RESULT = [[0, 1, 2, 3, 4, 5], 15]  # what every shape returns, uninterrupted


# ------------------------------------------------------------------------ the edits
#
# Each takes the source's lines and the seeded generator, and returns the edited lines
# (or None where it does not apply) and the extra `tcc upgrade` arguments it suggests.

Lines = list[str]
Edited = tuple[Lines | None, list[str]]


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def _awaits(lines: Lines) -> list[int]:
    """The lines with an await of `step` or `helper` (not a checkpoint)."""
    return [k for k, line in enumerate(lines) if "await " in line and "checkpoint" not in line]


def _index(lines: Lines, start: str) -> int | None:
    """The last line that starts (after its indent) with ``start``; None if none does
    (an earlier edit renamed or removed it)."""
    found = [k for k, line in enumerate(lines) if line.strip().startswith(start)]
    return found[-1] if found else None


def _main_start(lines: Lines) -> int:
    return _index(lines, "async def main") or 0


def _insert_around_await(lines: Lines, rng: random.Random, after: bool) -> Edited:
    if not _awaits(lines):
        return None, []
    k = rng.choice(_awaits(lines))
    stmt = rng.choice(["note = 1", "pass", "out.append(-1)", "total += 0", "note = i + 1"])
    at = k + 1 if after else k
    return lines[:at] + [_indent(lines[k]) + stmt + "\n"] + lines[at:], []


def insert_before_await(lines: Lines, rng: random.Random) -> Edited:
    return _insert_around_await(lines, rng, after=False)


def insert_after_await(lines: Lines, rng: random.Random) -> Edited:
    return _insert_around_await(lines, rng, after=True)


def change_constant(lines: Lines, rng: random.Random) -> Edited:
    old, new = rng.choice([("v * 1", f"v * {rng.randint(2, 9)}"),
                           ("total = 0", f"total = {rng.randint(1, 9)}"),
                           ("v = -1", "v = -2")])
    if not any(old in line for line in lines):
        return None, []
    return [line.replace(old, new) for line in lines], []


def rename_local(lines: Lines, rng: random.Random) -> Edited:
    name = rng.choice(["total", "out", "v", "i"])
    new = name + "_renamed"
    start = _main_start(lines)
    pattern = re.compile(rf"\b{name}\b")
    edited = lines[:start] + [pattern.sub(new, line) for line in lines[start:]]
    return edited, ["--rename", f"{name}={new}"] if rng.random() < 0.5 else []


def delete_uses(lines: Lines, rng: random.Random) -> Edited:
    name = rng.choice(["total", "out"])
    pattern = re.compile(rf"\b{name}\b")
    edited = []
    for line in lines:
        if line.strip().startswith("return out, total"):
            edited.append(pattern.sub("None", line))
        elif not pattern.search(line):
            edited.append(line)
    return edited, []


def second_await_before_loop(lines: Lines, rng: random.Random) -> Edited:
    at = _index(lines, rng.choice(["for ", "out = []"]))
    if at is None:
        return None, []
    return lines[:at] + ["    first = await step(100)\n"] + lines[at:], []


def remove_await_line(lines: Lines, rng: random.Random) -> Edited:
    if not _awaits(lines):
        return None, []
    k = rng.choice(_awaits(lines))
    return lines[:k] + lines[k + 1:], []


def wrap_loop_body(lines: Lines, rng: random.Random) -> Edited:
    head, end = _index(lines, "for "), _index(lines, "return ")
    if head is None or end is None:
        return None, []
    guard = rng.choice(["if True:", "if i >= 0:"])
    body = ["    " + line if line.strip() else line for line in lines[head + 1:end]]
    return lines[:head + 1] + ["        " + guard + "\n"] + body + lines[end:], []


def new_local_read_after(lines: Lines, rng: random.Random) -> Edited:
    if not any("v * 1" in line for line in lines):
        return None, []
    edited = [line.replace("v * 1", "v * 1 + bonus") for line in lines]
    where = rng.choice(["before the loop", "before the await"])
    at = _index(edited, "for ") if where == "before the loop" or not _awaits(edited) \
        else rng.choice(_awaits(edited))
    if at is None:
        return None, []
    edited[at:at] = [_indent(edited[at]) + "bonus = 3\n"]
    return edited, ["--set", "bonus=3"] if rng.random() < 0.5 else []


def change_iterable(lines: Lines, rng: random.Random) -> Edited:
    new = rng.choice(["range(8)", "range(0, 6)", "list(range(6))", "[0, 1, 2, 3, 4, 5]"])
    return [line.replace("range(6)", new) for line in lines], []


def insert_checkpoint(lines: Lines, rng: random.Random) -> Edited:
    label = rng.choice(["L", "loop", "after"])
    where = rng.choice(["before the await", "after the await", "before the loop", "before return"])
    if where in ("before the await", "after the await") and _awaits(lines):
        k = rng.choice(_awaits(lines))
        at = k if where == "before the await" else k + 1
        indent = _indent(lines[k])
    else:
        at = _index(lines, "return " if where == "before return" else "for ")
        indent = "    "
    if at is None:
        return None, []
    return lines[:at] + [f'{indent}await tcc.checkpoint("{label}")\n'] + lines[at:], []


def await_in_expression(lines: Lines, rng: random.Random) -> Edited:
    assignments = [k for k in _awaits(lines) if " = await " in lines[k]]
    if not assignments:
        return None, []
    k = rng.choice(assignments)
    target, _, call = lines[k].strip().partition(" = ")
    form = rng.choice(["0 + {}", "({}) + 0", "[{}][0]"])
    return lines[:k] + [f"{_indent(lines[k])}{target} = {form.format(call)}\n"] + lines[k + 1:], []


def close_over_local(lines: Lines, rng: random.Random) -> Edited:
    name = rng.choice(["total", "out"])
    at = _index(lines, "for ")
    if at is None:
        return None, []
    return lines[:at] + [f"    def peek():\n        return {name}\n"] + lines[at:], []


EDITS = (insert_before_await, insert_after_await, change_constant, rename_local, delete_uses,
         second_await_before_loop, remove_await_line, wrap_loop_body, new_local_read_after,
         change_iterable, insert_checkpoint, await_in_expression, close_over_local)


# ----------------------------------------------------------------------- a variant


@dataclasses.dataclass
class Variant:
    seed: int
    number: int
    shape: str
    kill_after: int
    edits: list[str]
    upgrade_args: list[str]
    dry_run_first: bool
    before: str
    after: str

    def __str__(self) -> str:
        return (f"seed {self.seed} variant {self.number}: shape {self.shape!r}, killed after "
                f"{self.kill_after} step(s), edits {self.edits}, upgrade args {self.upgrade_args}, "
                f"dry run first: {self.dry_run_first}\n--- before\n{self.before}--- after\n{self.after}")


def _variant(seed: int, number: int, rng: random.Random) -> Variant:
    """One variant, drawn from ``rng`` (so each seed gives the same variants).  Its first
    edit goes round EDITS across the seeds, so that together they try every edit; a
    third of the variants get a second, random one on top."""
    shape = rng.choice(sorted(SHAPES))
    before = HEADER + SHAPES[shape]
    lines = before.splitlines(keepends=True)
    names, args = [], []
    first = EDITS[(SEEDS.index(seed) * VARIANTS_PER_SEED + number) % len(EDITS)]
    for edit in [first] if rng.random() < 0.67 else [first, rng.choice(EDITS)]:
        edited, extra = edit(lines, rng)
        if edited is not None:
            lines, names, args = edited, [*names, edit.__name__], [*args, *extra]
    if not names:  # no edit applied: force one that always does
        lines, _ = insert_after_await(lines, rng)
        names = ["insert_after_await"]
    return Variant(seed, number, shape, rng.randint(1, 4), names, args, rng.random() < 0.5,
                   before, "".join(lines))


def _compiles(source: str) -> bool:
    try:
        compile(source, "agent.py", "exec", dont_inherit=True)
    except SyntaxError:
        return False
    return True


# ------------------------------------------------------------------ the checks


def _clean(proc: subprocess.CompletedProcess[str], what: str, variant: Variant) -> None:
    """No crash: no signal, and no internal error or traceback on stderr."""
    context = f"{what} -> {proc.returncode}\nstdout: {proc.stdout}\nstderr: {proc.stderr}\n{variant}"
    assert proc.returncode >= 0, "the process died of a signal: " + context
    for bad in ("internal error", "Traceback", "Fatal Python error", "Segmentation fault"):
        assert bad not in proc.stderr, context


def _killed(cli: Cli, run_id: str, script: pathlib.Path, *, after: int) -> None:
    """``tcc run`` SIGKILLed right after its ``after``-th step (as in test_pinned_code.py)."""
    killer = Cli.__new__(Cli)
    killer.store, killer.env = cli.store, dict(cli.env, TCC_TEST_KILL_AFTER=str(after))
    proc = killer.run("run", "--run-id", run_id, str(script))
    assert proc.returncode == -9, (proc.returncode, proc.stderr)
    assert cli.show(run_id)["status"] == "running"


def _plan(proc: subprocess.CompletedProcess[str], what: str, variant: Variant) -> dict:
    """The JSON plan of a `tcc upgrade --json`, checked against its exit code."""
    _clean(proc, what, variant)
    context = f"{what} -> {proc.returncode}\nstdout: {proc.stdout}\nstderr: {proc.stderr}\n{variant}"
    assert proc.returncode in (0, 1), context
    try:
        plan = json.loads(proc.stdout)
    except ValueError:
        raise AssertionError("no JSON plan on stdout: " + context) from None
    assert set(plan) == {"run", "snapshot", "ok", "written", "nothing_changed", "defaults", "refusals",
                         "frames"}, context
    assert plan["ok"] is (proc.returncode == 0), context
    assert bool(plan["refusals"]) is not plan["ok"], context
    return plan


def _snapshots(cli: Cli, run_id: str) -> list[int]:
    return [s["number"] for s in cli.show(run_id)["snapshots"]]


def _try_variant(cli: Cli, script: pathlib.Path, variant: Variant) -> str:
    """Kill, edit, upgrade, resume; "applied", "refused" or "unchanged" (the edit left
    the suspended frames' code as it was, e.g. a `pass` inserted: the upgrade only moves
    the run onto the current files, and it ends as the base does)."""
    run_id = f"s{variant.seed}v{variant.number}"
    script.write_text(variant.before)
    _killed(cli, run_id, script, after=variant.kill_after)
    script.write_text(variant.after)
    snapshots = _snapshots(cli, run_id)

    dry = None
    if variant.dry_run_first:
        what = f"tcc upgrade --json --dry-run {run_id} {' '.join(variant.upgrade_args)}"
        dry = _plan(cli.run("upgrade", "--json", "--dry-run", *variant.upgrade_args, run_id), what, variant)
        assert dry["written"] is None, variant
        assert _snapshots(cli, run_id) == snapshots, f"a dry run wrote a snapshot\n{variant}"

    what = f"tcc upgrade --json {run_id} {' '.join(variant.upgrade_args)}"
    plan = _plan(cli.run("upgrade", "--json", *variant.upgrade_args, run_id), what, variant)
    if dry is not None and not dry["ok"]:  # refused at dry run: refused the same way for real
        assert plan["refusals"] == dry["refusals"], f"{dry}\n{plan}\n{variant}"
    elif dry is not None and not plan["ok"]:  # only the real one restores the mapped frames
        assert all(why.startswith("the mapped snapshot does not restore") for why in plan["refusals"]), \
            f"{dry}\n{plan}\n{variant}"

    if plan["ok"]:
        assert plan["written"] is not None and plan["written"] not in snapshots, f"{plan}\n{variant}"
        proc = cli.run("resume", "--json", run_id)
        _clean(proc, f"tcc resume --json {run_id}", variant)
        assert "continues on the code it recorded" not in proc.stderr, f"{proc.stderr}\n{variant}"
        context = f"resume -> {proc.returncode}\nstdout: {proc.stdout}\nstderr: {proc.stderr}\n{variant}"
        assert proc.returncode in (0, 1, 2), context
        if plan["nothing_changed"]:  # the frames' code is the same: it ends as the base does
            assert proc.returncode == 0, context
            assert json.loads(proc.stdout)["result"] == BASE_RESULT, context
            return "unchanged"
        if proc.returncode == 0:
            assert json.loads(proc.stdout)["status"] == "completed", context
        elif proc.stdout.strip():  # the run failed in the agent's code: said in the JSON
            out = json.loads(proc.stdout)
            assert out["status"] == "failed" and out["error"], context
        else:  # tcc refused to resume it: said on stderr
            assert "tcc: error:" in proc.stderr, context
        return "applied"

    assert plan["written"] is None, f"{plan}\n{variant}"
    assert _snapshots(cli, run_id) == snapshots, f"a refused upgrade wrote a snapshot\n{plan}\n{variant}"
    assert cli.show(run_id)["status"] == "running", variant
    proc = cli.run("resume", "--json", "--code", "current", run_id)
    _clean(proc, f"tcc resume --code current {run_id}", variant)
    assert proc.returncode == 1 and "has changed since the snapshot was taken" in proc.stderr, \
        f"current-code resume -> {proc.returncode}\nstderr: {proc.stderr}\n{plan}\n{variant}"
    assert cli.show(run_id)["status"] == "running", variant
    # and the run is intact: on the code it recorded (the default), it ends as the base does
    proc = cli.run("resume", "--json", run_id)
    _clean(proc, f"tcc resume --json {run_id}", variant)
    assert proc.returncode == 0, f"pinned resume -> {proc.returncode}\n{proc.stderr}\n{variant}"
    assert json.loads(proc.stdout)["result"] == BASE_RESULT, f"{proc.stdout}\n{variant}"
    return "refused"


@pytest.mark.parametrize("seed", SEEDS)
def test_random_edits_never_crash_the_upgrade_or_the_resume(tmp_path, seed):
    """See the module docstring; each variant gets a store and a project of its own."""
    rng = random.Random(seed)
    variants = [_variant(seed, n, rng) for n in range(VARIANTS_PER_SEED)]
    counts = {"applied": 0, "refused": 0, "unchanged": 0, "does not compile": 0}
    for variant in variants:
        if not _compiles(variant.after):  # e.g. the only statement of a `try:` removed
            counts["does not compile"] += 1
            continue
        folder = tmp_path / f"v{variant.number}"
        (folder / "project").mkdir(parents=True)
        counts[_try_variant(Cli(folder), folder / "project" / "agent.py", variant)] += 1
    print(f"seed {seed}: {counts}")  # shown with -s
    assert counts["does not compile"] < len(variants), counts
