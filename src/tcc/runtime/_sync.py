"""Sync scripts: a plain ``def main`` runs on a greenlet, effects switch out.

Inside the greenlet, calling an effect (or ``tcc.approval``, ``tcc.sleep``...)
switches to the driver with the request and returns the answer -- the same
protocol as an ``await``, without ``async``.  Sync frames cannot be captured
(CPython has no way to resume a plain function mid-way), so such runs use the
``replay`` strategy: the journal is served to a fresh call of ``main``.
"""

from __future__ import annotations

from typing import Any, Callable

import greenlet  # type: ignore[import-untyped]

from ..effects import Current, reset_current, set_current


class SyncRun(greenlet.greenlet):  # type: ignore[misc]
    """The greenlet a sync ``main`` runs on (effects recognise it)."""

    run_id: str = ""


class GreenletTask:
    """Drive a sync function through ``send``/``throw`` like a coroutine."""

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], run_id: str,
                 tenant: str = "default") -> None:
        def body() -> Any:
            token = set_current(Current(run_id, tenant=tenant))
            try:
                return fn(*args)
            finally:
                reset_current(token)

        self.glet = SyncRun(body)
        self.glet.run_id = run_id

    def _result(self, value: Any) -> Any:
        if self.glet.dead:
            raise StopIteration(value)
        return value

    def send(self, value: Any) -> Any:
        return self._result(self.glet.switch(value) if self.glet else self.glet.switch())

    def throw(self, exc: BaseException) -> Any:
        return self._result(self.glet.throw(exc))

    def close(self) -> None:
        if self.glet and not self.glet.dead:
            try:
                self.glet.throw(greenlet.GreenletExit)
            except greenlet.GreenletExit:
                pass
