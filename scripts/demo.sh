#!/usr/bin/env bash
# Quick start, command 1: set up a virtualenv and run the main job -- an
# agent that is SIGKILLed mid-run and resumed in a new process.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e . >/dev/null
exec .venv/bin/python examples/resume_demo.py
