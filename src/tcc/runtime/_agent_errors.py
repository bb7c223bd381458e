"""The errors that tell an agent's author what the agent did that a tcc run cannot do:
a request it never awaited, an asyncio API inside the run, an await of something that
is not tcc's."""

from __future__ import annotations

import os
from typing import Any

from .. import errors
from ..effects import EffectRequest, describe_request, unawaited


def forgotten_await(made: list[Any], during: BaseException | None = None,
                    yielded: Any = None) -> errors.UnawaitedEffectError:
    """The error that fails a run whose agent made a request (an effect call, tcc.sleep ...)
    and never awaited it: outside a run the call would have returned its value, inside one
    the request object would silently stand in for it."""
    forgotten = unawaited(made, yielded)
    call = describe_request(forgotten[0])
    kind = "the effect call" if isinstance(forgotten[0], EffectRequest) else "the call"
    also = f" (and {len(forgotten) - 1} more in the same step)" if len(forgotten) > 1 else ""
    err = errors.UnawaitedEffectError(
        f"{kind} {call} at {getattr(forgotten[0], '_site', '?')} was not awaited before the "
        f"agent's next await{also}: inside a tcc run it returns a request that runs only when "
        f"awaited, so await each call (`await {call}`) before awaiting anything else, or pass "
        "effect calls to tcc.gather(...)"
    )
    if during is not None:
        err.__context__ = during
    return err


def explain_agent_error(exc: Exception) -> Exception:
    """``exc``, which failed the agent, with a hint if an asyncio API caused it."""
    if isinstance(exc, RuntimeError) and "no running event loop" in str(exc):
        tb, last = exc.__traceback__, None
        while tb is not None:
            last, tb = tb.tb_frame.f_code, tb.tb_next
        if last is not None and last.co_name == "sleep" and \
                last.co_filename.replace(os.sep, "/").endswith("asyncio/tasks.py"):
            hint = RuntimeError(
                f"{exc}: asyncio APIs do not work inside a tcc run, because the tcc driver, "
                "not an asyncio loop, runs the agent; instead of asyncio.sleep(), use "
                "`await tcc.sleep(seconds)`, a durable timer that also survives a crash")
            hint.__cause__ = exc
            return hint
        hint = RuntimeError(
            f"{exc}: asyncio APIs do not work inside a tcc run, because the tcc driver, "
            "not an asyncio loop, runs the agent; put asyncio work inside a @tcc.effect"
        )
        hint.__cause__ = exc
        return hint
    return exc


def unsupported_await(request: Any) -> TypeError:
    """The error thrown into an agent that awaited ``request``, which tcc cannot drive."""
    return TypeError(
        f"a tcc run can only await tcc effects, tcc.gather(), tcc.checkpoint() and "
        f"plain coroutines; the agent awaited {request!r} (asyncio futures and tasks "
        "cannot be awaited inside a tcc run; wrap the work in a @tcc.effect)"
    )
