"""``tcc ui``: a web dashboard over a store -- runs, timelines, frozen stacks, approvals.

Needs the ``ui`` extra (``pip install 'tcc[ui]'``: Starlette and uvicorn).  Everything it
shows or does goes through the functions the CLI calls (:mod:`tcc.runtime`); see
:mod:`._server` for how requests are authenticated.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from ...errors import UsageError

EXTRA_HINT = "tcc ui needs the ui extra: pip install 'tcc[ui]' (Starlette and uvicorn)"


def serve(store: Any, **options: Any) -> int:
    """Serve the dashboard for ``store`` (see :func:`._server.serve`)."""
    from ._server import serve as _serve

    return _serve(store, **options)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address, IPv6 with or without brackets) is this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_listen(host: str, port: int, allow_remote: bool) -> None:
    """UsageError for a port out of range, or a non-loopback ``host`` without ``allow_remote``."""
    if not is_loopback(host) and not allow_remote:
        raise UsageError(
            f"--host {host} is not a loopback address: anyone who can reach it and learns the token "
            "could act on your runs, over unencrypted HTTP; pass --allow-remote to do it anyway")
    if not 0 <= port <= 65535:
        raise UsageError(f"--port must be 0-65535, not {port}")


def missing_extra() -> str | None:
    """What to install for ``tcc ui``, or None if it is there."""
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        return EXTRA_HINT
    return None


__all__ = ["EXTRA_HINT", "check_listen", "is_loopback", "missing_extra", "serve"]
