"""Child process of test_corruption: run tcc CLI commands in-process against one (damaged) store.

Usage: python corruption_child.py STORE OUT.json COMMANDS.json

Each command (a `tcc` argv without --store) runs through the CLI's own entry
point ``tcc.cli._main._main`` -- argument parsing, error mapping and exit codes
exactly as `python -m tcc` -- with stdout/stderr captured; the results are
rewritten to OUT.json after every command, so a command that kills the process
(a signal) leaves the earlier results behind.  One process per mutant instead of
one per command keeps the campaign affordable.

`python -m tcc` leaves with os._exit(), so it never finalises the suspended
coroutine of a run it could not resume; in-process that coroutine is collected
between commands and would warn "coroutine ... was never awaited", which the
real CLI never prints: that warning is silenced here.
"""

from __future__ import annotations

import contextlib
import faulthandler
import io
import json
import sys
import traceback
import warnings


def main() -> None:
    faulthandler.enable()  # a fatal signal prints the Python stack: the parent reports it
    warnings.filterwarnings("ignore", message=r"coroutine .* was never awaited", category=RuntimeWarning)
    store, out_path, commands_path = sys.argv[1:4]
    with open(commands_path) as fh:
        commands = json.load(fh)
    from tcc.cli._main import _main

    results = []
    for argv in commands:
        out, err = io.StringIO(), io.StringIO()
        escaped = None
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                rc = _main([argv[0], "--store", store, *argv[1:]])
        except BaseException:  # noqa: BLE001 - the real CLI would print a traceback
            rc = None
            escaped = traceback.format_exc()
        results.append({"argv": argv, "rc": rc, "stdout": out.getvalue(), "stderr": err.getvalue(),
                        "escaped": escaped})
        with open(out_path, "w") as fh:
            json.dump(results, fh)


if __name__ == "__main__":
    main()
