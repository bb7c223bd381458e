"""Make the helper modules of this folder importable by plain name.

Child processes import ``programs`` by the same name, so the functions in it
are pickled by reference exactly as a user's importable module would be.
"""

import pathlib
import sys

HERE = str(pathlib.Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)
