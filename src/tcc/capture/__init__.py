"""Continuation capture: object graphs holding live generators <-> bytes.

:func:`safe_loads` reads a payload without running anything it contains, into
views (:class:`FrameView`, :class:`CodeView`, :class:`Stub`...) that a display
shows with a :class:`ViewRepr`.

This package knows nothing about stores or runtimes.
"""

import importlib as _importlib
import typing as _typing

from ._api import ATOMS as ATOMS
from ._api import dump_payload as dump_payload
from ._api import dump_stored as dump_stored
from ._api import check_frame_record as check_frame_record
from ._api import dumps as dumps
from ._api import load_payload as load_payload
from ._api import loads as loads
from ._blob import interpreter_tag as interpreter_tag
from ._blob import seal as seal
from ._blob import unseal as unseal
from ._frames import available as native_available
from ._frames import code_of as code_of
from ._frames import slot_names as slot_names
from ._fingerprint import fingerprint as fingerprint
from ._flow import instructions as flow_instructions
from ._flow import suspension_points as flow_points
from ._records import NULL as NULL_SLOT
from ._records import PINNED_PREFIX as PINNED_PREFIX
from ._records import process_modules as process_modules
from ._records import project_name as project_name
from ._records import set_process_modules as set_process_modules
from ._registry import register_reducer as register_reducer
from ._segments import SegmentCache as SegmentCache
from ._singletons import home as sentinel_home
from ._singletons import stateless_type as stateless_type

# What only a display of snapshots uses (``tcc inspect``, ``tcc show``, the dashboard) is
# imported when first asked for: the restricted loader and its views cost a `tcc resume`
# ~5 ms of imports it has no use for.
if _typing.TYPE_CHECKING:
    from ._safeload import safe_loads as safe_loads
    from ._viewrepr import ViewRepr as ViewRepr
    from ._viewrepr import views_shown_by as views_shown_by
    from ._views import UNBOUND as UNBOUND
    from ._views import AnyCode as AnyCode
    from ._views import CellView as CellView
    from ._views import CodeView as CodeView
    from ._views import FrameView as FrameView
    from ._views import Stub as Stub
    from ._views import code_line as code_line
    from ._views import frame_view as frame_view
    from ._views import stub_name as stub_name

_LAZY = {  # name -> the module that defines it
    "safe_loads": "._safeload",
    "ViewRepr": "._viewrepr",
    "views_shown_by": "._viewrepr",
    "UNBOUND": "._views",
    "AnyCode": "._views",
    "CellView": "._views",
    "CodeView": "._views",
    "FrameView": "._views",
    "Stub": "._views",
    "code_line": "._views",
    "frame_view": "._views",
    "stub_name": "._views",
}


def __getattr__(name: str) -> _typing.Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "ATOMS",
    "NULL_SLOT",
    "PINNED_PREFIX",
    "UNBOUND",
    "AnyCode",
    "CellView",
    "CodeView",
    "FrameView",
    "SegmentCache",
    "sentinel_home",
    "stateless_type",
    "Stub",
    "ViewRepr",
    "check_frame_record",
    "code_line",
    "code_of",
    "dump_payload",
    "dump_stored",
    "dumps",
    "fingerprint",
    "flow_instructions",
    "flow_points",
    "frame_view",
    "interpreter_tag",
    "load_payload",
    "loads",
    "native_available",
    "register_reducer",
    "safe_loads",
    "seal",
    "process_modules",
    "project_name",
    "set_process_modules",
    "slot_names",
    "stub_name",
    "unseal",
    "views_shown_by",
]
