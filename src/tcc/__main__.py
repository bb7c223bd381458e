"""``python -m tcc``: the same as the ``tcc`` command."""

import sys

from .cli import main

sys.exit(main())
