"""Who is running: the run a coroutine step belongs to, and the effect call
in flight.  The runtime sets these; effects and user code read them.
"""

from __future__ import annotations

import contextvars
import dataclasses


@dataclasses.dataclass(frozen=True)
class Current:
    """What ``tcc.current()`` returns.

    ``idempotency_key`` and ``attempt`` are set only while an effect runs: the
    key is the same for every attempt and for a re-issue after a crash, so an
    effect that passes it to an external API is exactly-once.
    """

    run_id: str
    effect: str | None = None
    idempotency_key: str | None = None
    attempt: int = 0
    # the store tenant the run belongs to: a key (``RUN_ID:N``) is unique within one store
    # and tenant, so an API several tenants share should see both
    tenant: str = "default"


_CURRENT: contextvars.ContextVar[Current | None] = contextvars.ContextVar("tcc_current", default=None)


def current() -> Current:
    """The run (and effect call) the calling code belongs to.

    Raises LookupError outside a tcc run.
    """
    value = _CURRENT.get()
    if value is None:
        raise LookupError("tcc.current() was called outside a tcc run")
    return value


def active() -> Current | None:
    return _CURRENT.get()


def set_current(value: Current | None) -> contextvars.Token[Current | None]:
    """Make ``value`` what :func:`current` returns (a runner does this around each step
    and each effect attempt); undo it with :func:`reset_current` and the token."""
    return _CURRENT.set(value)


def reset_current(token: contextvars.Token[Current | None]) -> None:
    """Undo the :func:`set_current` that returned ``token``."""
    _CURRENT.reset(token)
