"""The start-of-run reading of the agent's source for process state snapshots do not hold."""

from __future__ import annotations

import textwrap
import types

from tcc.runtime._process_state import process_state_notes


def _notes(tmp_path, source: str, limit: int = 10) -> list[str]:
    path = tmp_path / "agent.py"
    path.write_text(textwrap.dedent(source))
    module = types.ModuleType("agent")
    module.__file__ = str(path)
    return [n.split(": ", 1)[0] for n in process_state_notes([module], limit=limit)]


def test_aliases_and_the_ways_a_method_reaches_its_class(tmp_path):
    assert _notes(tmp_path, """\
        import numpy as np
        import numpy.random as npr
        from decimal import setcontext, Context

        class Box:
            size = 1            # the class body: the import's own
            def grow(self):
                type(self).size += 1
                self.__class__.size = 3
                self.size = 4   # an instance attribute: held by whatever holds the instance

        def main():
            np.random.seed(1)
            npr.seed(2)
            setcontext(Context(prec=3))
        """) == [
        "agent.py:8 sets a class attribute (type(self).size)",
        "agent.py:9 sets a class attribute (self.__class__.size)",
        "agent.py:13 calls np.random.seed()",
        "agent.py:14 calls npr.seed()",
        "agent.py:15 calls setcontext()",
    ]


def test_what_snapshots_hold_is_not_named(tmp_path):
    assert _notes(tmp_path, """\
        import random
        COUNTS = {}
        rng = random.Random(1)

        def f(x, memo=None, items=()):
            memo = memo or []
            memo.append(x)
            COUNTS[x] = rng.random()
            return memo

        def g(x, seen=[]):
            return x in seen   # a mutable default only read

        class Config:
            debug = False

        Config.debug = True    # the module body: the import runs it again
        random.seed(4)
        g.label = "g"

        def reseed():
            random.seed()      # from the OS: no sequence to reproduce
        """) == []


def test_a_mutable_default_changed_by_augmented_assignment(tmp_path):
    assert _notes(tmp_path, """\
        def f(x, seen=set(), log=[]):
            seen |= {x}
            log += [x]
        """) == [
        "agent.py:2 changes the default value of parameter 'seen' of f()",
        "agent.py:3 changes the default value of parameter 'log' of f()",
    ]


def test_unreadable_sources_are_passed_over_and_the_list_is_bounded(tmp_path):
    broken = types.ModuleType("broken")
    broken.__file__ = str(tmp_path / "missing.py")
    assert process_state_notes([broken, types.ModuleType("no_file")]) == []
    (tmp_path / "bad.py").write_text("def (:\n")
    bad = types.ModuleType("bad")
    bad.__file__ = str(tmp_path / "bad.py")
    assert process_state_notes([bad]) == []
    many = "import random\ndef f():\n" + "    random.seed(1)\n" * 20
    assert len(_notes(tmp_path, many, limit=3)) == 3
