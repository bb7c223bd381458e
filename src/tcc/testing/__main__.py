"""``python -m tcc.testing [options] SCRIPT[:FUNC] ARGS...``: see :func:`tcc.testing.main`."""

import sys

from ._cli import main

sys.exit(main())
