"""Stepping an agent: what a runner does around each ``send`` into it.

The runtime's driver and ``tcc.testing``'s in-process runner step an agent the
same way: ``tcc.current()`` names the run while the agent's code runs, and every
request the agent makes during the step is collected, so that one it never
awaited fails the run (:func:`~tcc.effects.unawaited`).
"""

from __future__ import annotations

from typing import Any

from . import _context
from ._effect import track_requests, untrack_requests


def step_agent(agent: Any, resumption: tuple[str, Any], run_id: str, made: list[Any] | None = None,
               tenant: str = "default") -> Any:
    """Send ``resumption`` -- ``("send", value)`` or ``("throw", exception)`` -- into ``agent``
    (a coroutine, or a ``tcc.runtime.GreenletTask``) as run ``run_id``; return the request
    it yields next.  StopIteration when the agent returns, its exception when it raises.

    The requests the agent makes meanwhile are appended to ``made`` (None: not collected).
    """
    token = _context.set_current(_context.Current(run_id, tenant=tenant))
    tracked = track_requests(made)
    try:
        if resumption[0] == "throw":
            return agent.throw(resumption[1])
        return agent.send(resumption[1])
    finally:
        untrack_requests(tracked)
        _context.reset_current(token)
