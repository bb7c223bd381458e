"""Continuation capture: object graphs holding live generators <-> bytes.

This package knows nothing about stores or runtimes.
"""

from ._api import dump_payload as dump_payload
from ._api import dumps as dumps
from ._api import load_payload as load_payload
from ._api import loads as loads
from ._blob import interpreter_tag as interpreter_tag
from ._blob import seal as seal
from ._blob import unseal as unseal
from ._frames import available as native_available
from ._pickler import register_reducer as register_reducer

__all__ = [
    "dump_payload",
    "dumps",
    "interpreter_tag",
    "load_payload",
    "loads",
    "native_available",
    "register_reducer",
    "seal",
    "unseal",
]
