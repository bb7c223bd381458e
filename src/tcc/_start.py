"""``tcc.start`` and ``tcc.resume``: durable runs from a library, without the CLI.

They open the store (a path, ``None`` for ``$TCC_STORE`` or ``./.tcc``, or an open
:class:`tcc.store.Store`, which is left open) and call the same runtime functions as
``tcc run`` and ``tcc resume``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # imported when called: `import tcc` in an agent stays light
    from .runtime import Outcome
    from .store import Store

@contextlib.contextmanager
def _opened(store: Store | str | os.PathLike[str] | None, tenant: str, *, create: bool) -> Iterator[Store]:
    from .store import open_store

    if isinstance(store, (str, os.PathLike)) or store is None:
        with open_store(store, tenant=tenant, create=create) as opened:
            yield opened
    else:
        yield store


def start(
    func: Callable[..., Any],
    *args: Any,
    run_id: str | None = None,
    store: Store | str | os.PathLike[str] | None = None,
    tenant: str = "default",
    strategy: str = "continuation",
    checkpoint_every: int | None = None,
    lease: float = 30.0,
    keep: int | None = None,
    wait_seconds: float = 0.0,
    verify: str | None = None,
) -> Outcome:
    """Run ``func(*args)`` durably and return its :class:`~tcc.runtime.Outcome`.

    ``func`` is an ``async def`` (or plain ``def``) at the top level of an importable module
    (or of the script being run as ``__main__``): a run that stops is resumed by importing it
    by name, in this process or another (``tcc resume RUN_ID``, ``tcc worker``).  ``args``
    must be JSON values.  With ``run_id``, an unfinished run of that id is resumed if it is
    the same call, as ``tcc run --run-id`` does.  The other options are ``tcc run``'s.
    """
    from . import runtime

    with _opened(store, tenant, create=True) as opened:
        return runtime.run(opened, func, args, run_id=run_id, strategy=strategy,
                           checkpoint_every=checkpoint_every, lease=lease, keep=keep,
                           wait_seconds=wait_seconds, verify=verify)


def resume(
    run_id: str,
    *,
    store: Store | str | os.PathLike[str] | None = None,
    tenant: str = "default",
    strategy: str | None = None,
    lease: float = 30.0,
    steal: bool = False,
    wait_seconds: float = 0.0,
) -> Outcome:
    """Continue the unfinished run ``run_id`` from its newest snapshot (``tcc resume``)."""
    from . import runtime

    with _opened(store, tenant, create=False) as opened:
        return runtime.resume(opened, run_id, strategy=strategy, lease=lease, steal=steal,
                              wait_seconds=wait_seconds)
