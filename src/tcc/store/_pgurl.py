"""Recognising and printing PostgreSQL store URLs, without importing the PostgreSQL store.

``tcc.store`` and the CLI need these for every store (is this path a URL? print it without
its password); the store itself, its driver and ``urllib`` load only when a URL is opened.
"""

from __future__ import annotations

import re

_URL = re.compile(r"(?i)postgres(ql)?://")


def is_postgres_url(where: object) -> bool:
    """Whether ``where`` names a PostgreSQL store (``postgresql://`` or ``postgres://``)."""
    return isinstance(where, str) and _URL.match(where) is not None


def redact(url: str) -> str:
    """``url`` without its password (safe to print)."""
    import urllib.parse

    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "postgresql://…"
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[-1]
    user = parts.username or ""
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))
