"""Effect calls: what an effect's name refers to, timeouts, effect methods and resources.

1. Names -- the journal records an effect by name, so one name must mean one function:
   two different functions under one name (factory closures, other options, a def
   repeated in a module, two modules choosing the same name) are refused when defined,
   and a script doing so fails to load; reloading a module replaces its effects.
2. Timeouts -- a timed-out sync effect's thread has ended before its retry (or the next
   call of that effect) starts; an async timeout names the effect.
3. Methods -- instance, static and class effects; a bound call journals its instance,
   and an instance that cannot be journaled fails the run with a hint.
4. Resources -- ``tcc.resource``: its truth is the wrapped object's, its factory runs
   once, and a snapshot holds the factory call, not the object.
5. Where a sync call runs -- on the driver's thread without a timeout, on its own with one.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
import textwrap
import threading

import pytest

import tcc
from tcc import errors, runtime
from tcc.capture import dump_payload, load_payload
from tcc.effects import lookup
from tcc.store import open_store

from tests._support.runs import AGENTS, Cli

AGENT = str(AGENTS / "effect_review_agent.py")
MODULE = "__tcc_script_effect_review_agent"


def run_here(tmp_path, func: str):
    """Start ``effect_review_agent.py:func`` in this process; return (outcome, journal)."""
    with open_store(tmp_path / "store") as store:
        outcome = runtime.start(store, f"{AGENT}:{func}")
        return outcome, store.journal(outcome.run_id)


def ledger(path) -> list[tuple[float, str]]:
    rows = [line.split(" ", 1) for line in path.read_text().splitlines()]
    return [(float(t), what) for t, what in rows]


def import_file(path, name: str):
    """Import ``path`` as module ``name`` (a fresh namespace each time)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


@pytest.fixture
def modules(tmp_path, monkeypatch):
    """Write modules into tmp_path; forget them (and their sys.path entry) afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # a reload must not see a stale .pyc
    before = set(sys.modules)
    written = []

    def write(name: str, source: str):
        path = tmp_path / f"{name}.py"
        path.write_text(textwrap.dedent(source))
        written.append(path)
        return path

    yield write
    for name in set(sys.modules) - before:
        mod = sys.modules.get(name)
        if mod is not None and getattr(mod, "__file__", None) in {str(p) for p in written}:
            del sys.modules[name]


# ------------------------------------------------------------------ 1. names


def test_reviewer_example_is_refused_at_load_instead_of_running_the_wrong_tool(tmp_path, modules):
    """The reviewer's factory script fails to load with a hint to pass name=, and no run is stored."""
    script = modules("review_dup_tools_agent", """
        import tcc

        def make_tool(label):
            @tcc.effect
            def tool(x): return f"{label}({x})"
            return tool

        upper = make_tool("UPPER"); lower = make_tool("lower")

        async def main(): return [await upper("a"), await lower("b")]
    """)
    with open_store(tmp_path / "store") as store:
        with pytest.raises(errors.ScriptImportError) as info:
            runtime.start(store, str(script))
        assert store.list_runs() == []
    cause = info.value.__cause__
    assert isinstance(cause, errors.UsageError) and isinstance(cause, errors.TccError)
    message = str(cause)
    assert "review_dup_tools_agent:make_tool.<locals>.tool" in message
    assert "@tcc.effect(name=" in message and f"{script}:5" in message


def test_factory_effects_with_different_closures_are_refused():
    """A second effect from one factory def, with other closure values, raises UsageError; the first stays."""

    def make_tool(label):
        @tcc.effect
        def tool(x):
            return f"{label}({x})"

        return tool

    upper = make_tool("UPPER")
    with pytest.raises(errors.UsageError, match=r"name=f\"tool-\{label\}\""):
        make_tool("lower")
    assert lookup(upper.name) is upper and upper("a") == "UPPER(a)"


def test_a_def_that_runs_again_with_nothing_different_is_allowed():
    """A helper that builds an identical effect on every call may be called again."""

    def make():
        @tcc.effect(retries=1)
        def ping(x):
            return x

        return ping

    first, second = make(), make()
    assert first.name == second.name and lookup(first.name) is second


def test_the_same_function_with_other_options_is_refused():
    """Wrapping one function twice with different options under one name is ambiguous (options are looked up by name)."""

    def fetch(x):
        return x

    tcc.effect(fetch)
    with pytest.raises(errors.UsageError, match="two different effects"):
        tcc.effect(retries=3)(fetch)


def test_a_def_repeated_in_one_module_is_refused(modules):
    """Two top-level effects of one name in one module execution raise UsageError."""
    path = modules("review_repeated_defs", """
        import tcc

        @tcc.effect
        def search(q): return "first"

        @tcc.effect
        def search(q): return "second"
    """)
    with pytest.raises(errors.UsageError, match="review_repeated_defs:search"):
        import_file(path, "review_repeated_defs")


def test_two_modules_choosing_one_name_are_refused(modules):
    """Two different modules that pass the same name= cannot both register it."""
    source = """
        import tcc

        @tcc.effect(name="review-shared-name")
        def act(x): return {tag!r}
    """
    import_file(modules("review_name_a", source.format(tag="a")), "review_name_a")
    with pytest.raises(errors.UsageError, match="review-shared-name"):
        import_file(modules("review_name_b", source.format(tag="b")), "review_name_b")


RELOADED = """
    import tcc

    VERSION = {version}

    @tcc.effect
    def top(x): return (VERSION, x)

    def make(label):
        @tcc.effect(name=f"{prefix}-{{label}}")
        def tool(x): return (VERSION, label, x)
        return tool

    def make_auto(label):
        @tcc.effect
        def auto(x): return (VERSION, label, x)
        return auto

    named = make("n")
    auto = make_auto("a")
"""


def test_reloading_or_loading_a_module_again_replaces_its_effects(modules):
    """importlib.reload, a fresh import and an import under another name keep working; the newest effects win."""
    path = modules("review_reloaded", RELOADED.format(version=1, prefix="review-reload"))
    mod = importlib.import_module("review_reloaded")
    assert lookup("review_reloaded:top")("x") == (1, "x")
    path.write_text(textwrap.dedent(RELOADED.format(version=2, prefix="review-reload")))
    importlib.invalidate_caches()
    mod = importlib.reload(mod)  # same namespace, new spec
    assert lookup("review_reloaded:top") is mod.top and mod.top("x") == (2, "x")
    assert lookup("review-reload-n") is mod.named and lookup(mod.auto.name) is mod.auto
    del sys.modules["review_reloaded"]
    fresh = importlib.import_module("review_reloaded")  # a new namespace
    assert lookup("review-reload-n") is fresh.named and fresh.named("y") == (2, "n", "y")
    other = import_file(path, "review_reloaded_again")  # the same file, another module name
    assert lookup("review-reload-n") is other.named


def test_script_loaded_again_after_being_forgotten_keeps_working(tmp_path, modules):
    """runtime.load_script of a script whose module was dropped from sys.modules loads it again without error."""
    script = modules("review_loaded_twice_agent", RELOADED.format(version=1, prefix="review-twice"))
    name = runtime.load_script(str(script)).__name__
    del sys.modules[name]
    again = runtime.load_script(str(script))
    assert lookup("review-twice-n") is again.named and lookup(again.auto.name) is again.auto


def test_named_factory_effects_each_run_their_own_function(tmp_path):
    """Inside a run, effects a factory built with distinct name= run their own closures."""
    outcome, journal = run_here(tmp_path, "named_tools")
    assert outcome.status == "completed", outcome.error
    assert outcome.result == ["UPPER(a)", "lower(b)"]
    assert [r.name for r in journal if r.kind == "intent"] == ["review-tool-UPPER", "review-tool-lower"]


def test_named_factory_effects_resume_in_a_new_process(tmp_path):
    """Effects held in locals across a park are found by name when another process resumes the run."""
    cli = Cli(tmp_path)
    parked = json.loads(cli.run("run", "--json", "--run-id", "n1", f"{AGENT}:tools_across_approval",
                                check=True).stdout)
    assert parked["status"] == "waiting"
    cli.run("approve", "n1", check=True)
    done = json.loads(cli.run("resume", "--json", "n1", check=True).stdout)
    assert done["status"] == "completed"
    assert done["result"] == ["UPPER(a)", True, "lower(b)", "UPPER(c)"]


# --------------------------------------------------------------- 2. timeouts


def test_sync_timeout_retry_starts_after_the_timed_out_thread_ended(tmp_path, monkeypatch):
    """A timed-out sync attempt's thread ends before the retry's intent is journaled and the retry starts."""
    path = tmp_path / "ledger"
    monkeypatch.setenv("LEDGER", str(path))
    outcome, journal = run_here(tmp_path, "sync_timeout")
    assert outcome.status == "completed", outcome.error
    assert outcome.result.startswith(
        f"caught: effect '{MODULE}:slow' timed out after 0.2 s (its thread cannot be stopped")
    rows = ledger(path)
    assert [what for _t, what in rows] == ["start 1", "end 1", "start 2", "end 2"]
    intents = [r for r in journal if r.kind == "intent"]
    completions = [r for r in journal if r.kind == "completion"]
    assert [r.attempt for r in intents] == [1, 2]
    assert len(completions) == 2 and all(r.error is not None for r in completions)
    error = load_payload(completions[0].error)
    assert isinstance(error, TimeoutError) and f"'{MODULE}:slow' timed out after 0.2 s" in str(error)
    assert intents[1].time >= rows[1][0]  # the retry's intent follows the first thread's end
    assert completions[0].time < rows[1][0]  # the failure itself is journaled at the timeout


def test_calling_an_effect_again_after_its_timeout_waits_for_the_old_thread(tmp_path, monkeypatch):
    """After a final timeout the agent goes on, but its next call of that effect starts after the old thread."""
    path = tmp_path / "ledger"
    monkeypatch.setenv("LEDGER", str(path))
    outcome, _journal = run_here(tmp_path, "call_again_after_timeout")
    assert outcome.status == "completed", outcome.error
    assert outcome.result == ["first", "second"]
    assert [what for _t, what in ledger(path)] == ["start first", "end first", "start second", "end second"]


def test_async_timeout_names_the_effect_and_keeps_an_own_timeout_error(tmp_path):
    """An async effect cancelled by its timeout says which effect and after how long; its own TimeoutError is kept."""
    outcome, _journal = run_here(tmp_path, "async_timeouts")
    assert outcome.status == "completed", outcome.error
    assert outcome.result == [
        f"effect '{MODULE}:async_slow' timed out after 0.2 s (it was cancelled)",
        "the service said: too slow",
    ]


# ---------------------------------------------------------------- 3. methods


EXPECTED_METHODS = ["m*3", "async a*3", "unbound*3", "static s", "static s", "Svc c", "Svc c"]


def test_methods_inside_a_run_pass_and_journal_the_instance(tmp_path):
    """Instance, static and class effects work in a run; a bound call journals the instance as the first argument."""
    outcome, journal = run_here(tmp_path, "methods")
    assert outcome.status == "completed", outcome.error
    assert outcome.result == EXPECTED_METHODS
    first = next(r for r in journal if r.kind == "intent")
    assert first.name == f"{MODULE}:Svc.method"
    (svc, x), kwargs = load_payload(first.args)
    assert type(svc).__name__ == "Svc" and svc.n == 3 and x == "m" and kwargs == {}


def test_methods_outside_a_run_are_plain_methods(tmp_path):
    """Outside a run, effect methods behave like the methods they wrap."""
    import asyncio

    agent = import_file(AGENT, "review_agent_imported")  # also: the same script under a second name
    try:
        svc = agent.Svc(3)
        assert [
            svc.method("m"), asyncio.run(svc.amethod("a")), agent.Svc.method(svc, "unbound"),
            svc.static_above("s"), agent.Svc.static_below("s"), svc.class_above("c"),
            agent.Svc.class_below("c"),
        ] == EXPECTED_METHODS
        assert isinstance(agent.Svc.__dict__["method"], tcc.effects.Effect)
    finally:
        del sys.modules["review_agent_imported"]


def test_a_bound_effect_in_a_local_survives_a_resume_in_a_new_process(tmp_path):
    """A bound effect method kept in a local is captured and called after another process resumes."""
    cli = Cli(tmp_path)
    parked = json.loads(cli.run("run", "--json", "--run-id", "m1", f"{AGENT}:method_across_approval",
                                check=True).stdout)
    assert parked["status"] == "waiting"
    cli.run("approve", "m1", check=True)
    done = json.loads(cli.run("resume", "--json", "m1", check=True).stdout)
    assert done["status"] == "completed" and done["result"] == [True, "x*4"]


def test_an_instance_that_cannot_be_journaled_fails_the_run_with_a_hint(tmp_path):
    """A method call whose instance holds a lock fails the run (not left running) and suggests tcc.resource."""
    cli = Cli(tmp_path)
    proc = cli.run("run", "--run-id", "u1", f"{AGENT}:uncapturable_self")
    assert proc.returncode == 1
    assert f"the arguments of effect '{MODULE}:Locked.method' cannot be journaled" in proc.stderr
    assert "journals the instance (a Locked)" in proc.stderr and "tcc.resource" in proc.stderr
    assert "Traceback" not in proc.stderr
    shown = cli.show("u1")
    assert shown["status"] == "failed" and "Locked.method" in shown["error"]


# -------------------------------------------------------------- 4. resources


class Client:
    """Has no __len__ and no __bool__: truth is the default (True)."""

    def __init__(self, url):
        self.url = url


def test_resource_truth_is_the_wrapped_objects():
    """`if client:` works on a resource of an object without __len__, and follows the object's truth."""
    client = tcc.resource(Client, "http://x")
    assert bool(client) is True
    if not client:
        pytest.fail("a resource of a Client must be truthy")
    assert client.url == "http://x"
    assert bool(tcc.resource(list)) is False and bool(tcc.resource(list, [1])) is True


def test_resource_factory_returning_none_is_called_once():
    """A factory that returns None is not called again on every use."""
    calls = []

    def factory():
        calls.append(1)

    res = tcc.resource(factory)
    assert bool(res) is False
    with pytest.raises(AttributeError):
        res.anything
    assert not res
    assert calls == [1]


MADE: list[int] = []


def make_lock() -> threading.Lock:
    MADE.append(1)
    return threading.Lock()


def test_resource_snapshot_holds_the_factory_call_not_the_object():
    """A captured resource is rebuilt lazily by calling its factory again, once."""
    MADE.clear()
    res = tcc.resource(make_lock)
    assert res  # built: a lock is truthy
    copy = load_payload(dump_payload(res))
    assert MADE == [1]
    assert copy.locked() is False and copy and MADE == [1, 1]


# 5. Where a sync call runs -------------------------------------------------------------

_WHERE = '''
import asyncio, threading
import tcc

@tcc.effect
def plain(x):
    async def doubled():
        return x * 2
    return threading.get_ident(), asyncio.run(doubled())  # no loop runs while it is called

@tcc.effect(timeout=30)
def timed(x):
    return threading.get_ident(), x

@tcc.effect
def stops(x):
    raise StopIteration(x)

@tcc.effect(timeout=30)
def stops_timed(x):
    raise StopIteration(x)

async def main():
    here = threading.get_ident()
    (p_thread, p_value), (t_thread, t_value) = await plain(21), await timed(7)
    errors = []
    for call in (stops, stops_timed):
        try:
            await call(1)
        except RuntimeError as exc:
            errors.append(str(exc))
    return {"plain_here": p_thread == here, "plain": p_value, "timed_here": t_thread == here,
            "timed": t_value, "errors": errors}
'''


def test_a_sync_call_without_timeout_runs_on_the_drivers_thread_and_a_timed_one_on_its_own(tmp_path):
    """No thread per call for a plain sync effect (it may run its own event loop); a timed
    one keeps its thread (the timeout needs it); both turn StopIteration into the same
    RuntimeError, as a future cannot carry it."""
    script = tmp_path / "where.py"
    script.write_text(_WHERE)
    with open_store(tmp_path / "store") as store:
        outcome = runtime.start(store, str(script))
    assert outcome.status == "completed", outcome
    assert outcome.result == {"plain_here": True, "plain": 42, "timed_here": False, "timed": 7,
                              "errors": ["effect raised StopIteration: 1"] * 2}
