"""The answers a test gives to the agent's waits and approvals (in-process runs and the checker)."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence, Union

from .. import errors

# approvals=: one answer for every approval, one per approval in order, or a function of the prompt
Approvals = Union[bool, Sequence[bool], Callable[[str], Any], None]


class MissingAnswerError(errors.UsageError):
    """The agent waits for a signal or an approval that the test did not provide."""


class sequence:  # noqa: N801 - used like a function: signals={"note": sequence("a", "b")}
    """Answers for successive waits on one signal name: the k-th wait gets the k-th value."""

    __slots__ = ("values",)

    def __init__(self, *values: Any) -> None:
        self.values = values

    def __repr__(self) -> str:
        return f"sequence{self.values!r}"


class Answers:
    """The answers a test gives to waits and approvals (shared by run and the checker)."""

    def __init__(self, signals: Mapping[str, Any] | None, approvals: Approvals) -> None:
        self.signals = dict(signals or {})
        self.approvals = approvals

    def answer(self, kind: str, name: str, occurrence: int, prompt: str | None) -> tuple[bool, Any]:
        """(found, value) for the ``occurrence``-th (1-based) wait on ``name``."""
        if kind == "approval":
            given = self.approvals
            if given is None:
                return False, None
            if isinstance(given, bool):
                return True, given
            if callable(given):
                return True, bool(given(prompt or ""))
            if isinstance(given, sequence):
                given = list(given.values)
            if occurrence <= len(given):
                return True, bool(given[occurrence - 1])
            return False, None
        if name not in self.signals:
            return False, None
        value = self.signals[name]
        if isinstance(value, sequence):
            if occurrence <= len(value.values):
                return True, value.values[occurrence - 1]
            return False, None
        return True, value

    def missing(self, kind: str, name: str, wait_id: str, prompt: str | None) -> str:
        if kind == "approval":
            return (f"the agent awaits tcc.approval({prompt!r}) (wait {wait_id}) but no answer was "
                    "given: pass approvals=True/False, a list of them, or a function of the prompt")
        have = self.signals.get(name)
        more = (f" (its sequence{have.values!r} has fewer values)" if isinstance(have, sequence)
                else "")
        return (f"the agent awaits tcc.wait_for({name!r}) (wait {wait_id}) but no answer was "
                f"given{more}: pass signals={{{name!r}: VALUE}}, or sequence(...) for several waits")

