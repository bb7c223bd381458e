"""``tcc ui``: a web dashboard over a store -- runs, timelines, frozen stacks, approvals.

Needs the ``ui`` extra (``pip install 'tcc[ui]'``: Starlette and uvicorn).  Everything it
shows or does goes through the functions the CLI calls (:mod:`tcc.runtime`); see
:mod:`._server` for how requests are authenticated.
"""

from __future__ import annotations

from typing import Any

EXTRA_HINT = "tcc ui needs the ui extra: pip install 'tcc[ui]' (Starlette and uvicorn)"


def serve(store: Any, **options: Any) -> int:
    """Serve the dashboard for ``store`` (see :func:`._server.serve`)."""
    from ._server import serve as _serve

    return _serve(store, **options)


def missing_extra() -> str | None:
    """What to install for ``tcc ui``, or None if it is there."""
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        return EXTRA_HINT
    return None


__all__ = ["EXTRA_HINT", "missing_extra", "serve"]
