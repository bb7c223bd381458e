"""Argument parsing and exit codes for ``tcc``.

Exit codes: 0 success, 1 a tcc error (one line on stderr, traceback only
with ``--debug``), 2 a usage error.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from .. import _version
from ..errors import TccError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tcc",
        description="Transparent continuation checkpointing for async Python.",
    )
    parser.add_argument("--version", action="version", version=f"tcc {_version.__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    info = sub.add_parser("info", help="show the interpreter tag and native-module status")
    info.set_defaults(handler=_cmd_info)
    return parser


def _cmd_info(args: argparse.Namespace) -> int:
    from .. import capture

    print(f"tcc {_version.__version__}")
    print(f"interpreter tag: {capture.interpreter_tag().decode()}")
    native = "available" if capture.native_available() else "NOT available (replay only)"
    print(f"native frame module: {native}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        return int(handler(args))
    except TccError as exc:
        if args.debug:
            raise
        print(f"tcc: error: {exc}", file=sys.stderr)
        return 1
