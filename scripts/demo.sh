#!/usr/bin/env bash
# Quick start, command 1: set up a virtualenv and run the main job -- the
# research agent is run by `tcc run`, SIGKILLed mid-run, and continued by
# `tcc resume` from its newest snapshot in the embedded LMDB store (./.tcc).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e . >/dev/null
exec .venv/bin/python examples/crash_and_resume.py
