"""``python -m tcc.testing``: the crash-every-step checker from a shell."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Sequence

from .. import errors
from ._checker import check_crash_every_step


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tcc.testing [options] SCRIPT[:FUNC] ARGS...``: print the report; exit 1
    on a mismatch, 2 on a usage error."""
    from ..runtime import STRATEGIES

    parser = argparse.ArgumentParser(
        prog="python -m tcc.testing",
        description="Crash a tcc agent after each of its journaled steps, resume it, and "
                    "compare with an uninterrupted run.")
    parser.add_argument("--strategy", default="continuation", choices=STRATEGIES)
    parser.add_argument("--checkpoint-every", type=int, default=None, metavar="K")
    parser.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS",
                        help="bound for each tcc process (default 60)")
    parser.add_argument("--jobs", type=int, default=None, metavar="N", help="crash points at once")
    parser.add_argument("--signal", action="append", default=[], metavar="NAME=JSON",
                        help="answer tcc.wait_for(NAME) with this value (repeat for more names)")
    parser.add_argument("--approve", choices=("yes", "no"), default=None,
                        help="answer every tcc.approval")
    parser.add_argument("script", metavar="SCRIPT[:FUNC]")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    ns = parser.parse_args(argv)
    signals: dict[str, Any] = {}
    for item in ns.signal:
        name, sep, raw = item.partition("=")
        try:
            signals[name] = json.loads(raw) if sep else None
        except ValueError as exc:
            parser.error(f"--signal {name}: the value must be JSON ({exc})")
    approvals = None if ns.approve is None else ns.approve == "yes"
    try:
        report = check_crash_every_step(
            ns.script, *ns.args, strategy=ns.strategy, checkpoint_every=ns.checkpoint_every,
            timeout=ns.timeout, jobs=ns.jobs, signals=signals, approvals=approvals)
    except errors.UsageError as exc:
        print(f"tcc.testing: error: {exc}", file=sys.stderr)
        return 2
    print(report)
    return 0 if report.ok else 1
