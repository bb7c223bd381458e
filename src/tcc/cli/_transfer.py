"""``tcc export`` and ``tcc import``: move a run (with its children) between stores.

The parsers and handlers only; the rules (the file format, what is refused, what the
imported runs become) are :mod:`tcc.runtime`'s ``export_run``/``import_run``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Callable

from ..errors import UsageError
from . import _render

__all__ = ["add_parsers", "cmd_export", "cmd_import"]

_KEY_HELP = ("the transfer key file (64 hex digits, mode 0600) that encrypts and authenticates "
             "the file; not a store key (default: $TCC_TRANSFER_KEY_FILE)")


def add_parsers(sub: Any, common: Callable[[argparse.ArgumentParser], None]) -> None:
    """Add ``export`` and ``import`` to ``sub`` (``add_subparsers()``'s action); ``common``
    adds the options every store command takes (--store, --tenant, --json ...)."""
    export = sub.add_parser("export", help="write a run, with the runs it spawned, to one encrypted, "
                            "authenticated file that `tcc import` reads into any store")
    common(export)
    export.add_argument("run_id", metavar="RUN_ID")
    export.add_argument("-o", "--output", required=True, metavar="FILE", help="the file to write (mode 0600)")
    export.add_argument("--transfer-key", metavar="PATH",
                        help=_KEY_HELP + "; created if it does not exist: copy it to where the "
                             "run is imported")
    export.set_defaults(handler=cmd_export)

    imp = sub.add_parser("import", help="create the runs of a `tcc export` file in this store; "
                         "`tcc resume` continues them where they stopped")
    common(imp)
    imp.add_argument("file", metavar="FILE")
    imp.add_argument("--run-id", dest="new_run_id", metavar="NEW",
                     help="import the run as NEW (its children as NEW.k); refused while a call of "
                          "the run is in flight, or it failed (their idempotency keys would change)")
    imp.add_argument("--transfer-key", metavar="PATH", help=_KEY_HELP)
    imp.set_defaults(handler=cmd_import)


def _key_path(args: argparse.Namespace) -> str:
    from ..runtime import TRANSFER_KEY_ENV

    path = args.transfer_key or os.environ.get(TRANSFER_KEY_ENV) or ""
    if not path:
        raise UsageError(f"tcc {args.command} needs the transfer key that encrypts the file: "
                         f"--transfer-key PATH or ${TRANSFER_KEY_ENV} (tcc export creates it if it "
                         "does not exist; it is not the store's key)")
    return path


def _open(args: argparse.Namespace, *, create: bool) -> Any:
    from ._main import _open as open_store  # (imported here: _main imports this module)

    return open_store(args, create=create)


def cmd_export(args: argparse.Namespace) -> int:
    from ..runtime import export_run, make_transfer_key, read_transfer_key

    path = _key_path(args)
    made = make_transfer_key(path)
    key = read_transfer_key(path)
    with _open(args, create=False) as store:
        done = export_run(store, args.run_id, args.output, key=key)
    doc = {"id": done.run_id, "file": done.path, "runs": list(done.runs), "snapshots": done.snapshots,
           "journal": done.journal, "bytes": done.size, "key_id": done.key_id,
           "key_file": os.path.abspath(path), "key_file_created": made}
    if made:
        print(f"tcc: created the transfer key file {_render.clean(path)} (mode 0600): `tcc import` "
              "needs it; copy it over a channel you trust", file=sys.stderr)
    if args.json:
        print(json.dumps(doc))
    else:
        children = len(done.runs) - 1
        print(f"exported run {_render.clean(done.run_id)}"
              + (f" and {children} run{'s' if children != 1 else ''} it spawned" if children else "")
              + f" to {_render.clean(done.path)} ({done.size} bytes, encrypted with transfer key "
              f"{done.key_id})")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    from ..runtime import import_run, read_transfer_key

    key = read_transfer_key(_key_path(args))
    with _open(args, create=True) as store:  # an LMDB store is made, as by `tcc run`
        done = import_run(store, args.file, key=key, run_id=args.new_run_id)
    if args.json:
        print(json.dumps({"id": done.run_id, "from": done.source_run_id, "status": done.status,
                          "runs": dict(done.runs)}))
    else:
        print(_render.clean(done.run_id))
    return 0
