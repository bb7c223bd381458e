"""Behaviour of restored continuations beyond plain resumption."""

from __future__ import annotations

import base64
import textwrap

import tcc
from tests._support import programs
from tests._support.childrun import run_child, run_child_json


def blob_arg(obj: object) -> str:
    return base64.b64encode(tcc.dumps(obj)).decode()


def test_close_after_restore_runs_finally_in_fresh_process():
    """close() on a restored coroutine runs its pending `finally` block."""
    task = programs.with_cleanup("t")
    task.send(None)
    code = textwrap.dedent(
        """
        import base64, json, sys
        import tcc
        from tests._support import programs
        task = tcc.loads(base64.b64decode(sys.argv[1]))
        task.close()
        print(json.dumps(programs.CLEANUP_LOG))
        """
    )
    assert run_child_json(code, blob_arg(task)) == ["finally:t"]
    task.close()


def test_throw_after_restore_reaches_the_except_block_in_fresh_process():
    """throw() into a restored coroutine is handled by the frame's own `except`."""
    task = programs.with_cleanup("t")
    task.send(None)
    code = textwrap.dedent(
        """
        import base64, json, sys
        import tcc
        from tests._support import programs
        task = tcc.loads(base64.b64decode(sys.argv[1]))
        req = task.throw(KeyError("boom"))
        trace, result = programs.drive(task, first=programs.answer(req))
        print(json.dumps([repr(req), result, programs.CLEANUP_LOG]))
        """
    )
    req, result, log = run_child_json(code, blob_arg(task))
    assert req == "Req('handled', 't')"
    assert result == repr("handled<t>")
    assert log == ["except:'boom'", "finally:t"]
    task.close()


def test_exception_chain_survives_capture():
    """__cause__, __context__ and __suppress_context__ of a captured exception are kept."""
    try:
        try:
            raise KeyError("root")
        except KeyError as root:
            raise ValueError("mid") from root
    except ValueError as exc:
        captured = exc
    context_only = RuntimeError("ctx")
    context_only.__context__ = OSError(2, "missing", "/x")
    restored, restored_ctx = tcc.loads(tcc.dumps((captured, context_only)))
    assert type(restored) is ValueError and restored.args == ("mid",)
    assert repr(restored.__cause__) == repr(KeyError("root"))
    assert restored.__context__ is restored.__cause__
    assert restored.__suppress_context__ is True
    assert restored.__traceback__ is None
    assert isinstance(restored_ctx.__context__, FileNotFoundError)
    assert restored_ctx.__context__.filename == "/x"


def test_unstarted_and_finished_generators_round_trip():
    """An unstarted coroutine resumes from the top; a finished one stays finished."""
    fresh = programs.closures(2)
    done = programs.gen_source(0)
    assert list(done) == []
    fresh2, done2 = tcc.loads(tcc.dumps((fresh, done)))
    assert programs.drive(fresh2) == programs.drive(fresh)
    assert list(done2) == []
    assert done2.gi_frame is None


def test_bare_generator_expression_and_plain_generator():
    """A half-consumed generator expression and a yield-from generator resume in place."""
    squares = (x * x for x in range(6))
    assert [next(squares), next(squares)] == [0, 1]
    chain = programs.delegating(2)
    first = next(chain)
    sq2, chain2 = tcc.loads(tcc.dumps((squares, chain)))
    assert list(sq2) == [4, 9, 16, 25]
    assert list(squares) == [4, 9, 16, 25]
    assert programs.drive(chain2, first=programs.answer(first)) == programs.drive(
        chain, first=programs.answer(first)
    )


def test_restore_of_a_restored_continuation():
    """Capturing a continuation that was itself restored works, repeatedly."""
    trace, result = programs.drive(programs.research_agent("x"))
    task = programs.research_agent("x")
    pending = None
    done = 0
    originals = []
    for step in range(len(trace)):
        originals.append((task, pending))
        task, pending = tcc.loads(tcc.dumps((task, pending)))
        req = task.throw(pending) if isinstance(pending, BaseException) else task.send(pending)
        assert repr(req) == trace[step]
        pending = programs.answer(req)
        done += 1
    assert programs.drive(task, first=pending) == ([], result)
    assert done == len(trace)
    for old, old_pending in originals:  # the captured originals were not disturbed
        assert programs.drive(old, first=old_pending)[1] == result


def test_unpicklable_failure_in_child_leaves_no_half_state(tmp_path):
    """A blob that fails to restore raises a RestoreError and no frame is resumed."""
    task = programs.with_cleanup("z")
    task.send(None)
    blob = tcc.dumps(task)
    code = textwrap.dedent(
        """
        import base64, sys, json
        import tcc
        from tests._support import programs
        del programs.with_cleanup
        try:
            tcc.loads(base64.b64decode(sys.argv[1]))
        except tcc.RestoreError as exc:
            print(json.dumps([type(exc).__name__, str(exc), programs.CLEANUP_LOG]))
        """
    )
    name, message, log = run_child_json(code, base64.b64encode(blob).decode())
    assert name == "IncompatibleSnapshotError"
    assert "with_cleanup" in message
    assert log == []
    task.close()


def test_child_process_sees_no_warnings(tmp_path):
    """Restoring and finishing in a child with -W error emits no warning."""
    task = programs.contexts("w")
    pending = programs.advance(task, 3)
    proc = run_child(
        "import base64, sys, tcc\n"
        "from tests._support import programs\n"
        "t, p = tcc.loads(base64.b64decode(sys.argv[1]))\n"
        "print(programs.drive(t, first=p)[1])\n",
        blob_arg((task, pending)),
        flags=("-W", "error", "-X", "dev"),
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert programs.drive(task, first=pending)[1] == proc.stdout.strip()


class KeywordOnlyError(Exception):
    def __init__(self, *, code: int) -> None:
        super().__init__(f"code {code}")
        self.code = code


def test_exception_with_keyword_only_init_round_trips():
    """An exception whose __init__ takes only keyword arguments is rebuilt without calling it."""
    err = KeywordOnlyError(code=7)
    back = tcc.loads(tcc.dumps(err))
    assert type(back) is KeywordOnlyError and back.code == 7 and str(back) == "code 7"
    oserr = tcc.loads(tcc.dumps(FileNotFoundError(2, "missing", "/x")))
    assert type(oserr) is FileNotFoundError and oserr.errno == 2 and oserr.filename == "/x"
