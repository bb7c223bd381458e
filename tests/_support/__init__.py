"""Helpers shared by the test suite: imported as ``tests._support.<module>``, never collected.

* ``runs`` -- run the ``tcc`` CLI in subprocesses against a private store (``Cli``), and
  ``AGENTS``, the folder of agent scripts (``agents/``) those runs execute.
* ``programs`` -- coroutine programs that suspend on requests, pickled by reference
  (a child process imports them as ``tests._support.programs`` too).
* ``childrun`` -- run code in fresh child interpreters that can import this package.
* ``stores`` -- deterministic payloads and a fresh-interpreter runner for the store tests.
* ``backends`` -- where a store of each backend (LMDB, PostgreSQL) lives, for tests that
  run on both (``Site``).
* ``reliability`` -- ledgers, clear-error checks and raw LMDB access for the reliability suite.
* ``fixtures`` -- a private copy of a checked-in fixture store (tests/fixtures).
* ``users`` -- two real users (root and ``nobody``) for the store-trust tests.

``ROOT`` is the repository root: a child process that imports this package needs it on
``sys.path`` (pytest itself gets it from ``pythonpath`` in pyproject.toml).
"""

import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
