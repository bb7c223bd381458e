"""Make tests/runtime's helper module (Cli, AGENTS) importable by plain name."""

import pathlib
import sys

RUNTIME = str(pathlib.Path(__file__).resolve().parent.parent / "runtime")
if RUNTIME not in sys.path:
    sys.path.insert(0, RUNTIME)
