#!/usr/bin/env bash
# Quick start, command 2: run the test suite on every supported CPython found.
#
# For each of 3.11, 3.12 and 3.13 found on PATH or under pyenv, build a
# virtualenv .venv-3.X, install tcc with its C extension and the test extras,
# and run pytest.  Extra arguments go to pytest.
#
#   TCC_REQUIRE_ALL_PYTHONS=1   fail if any of the three is missing (CI)
#   TCC_REQUIRE_NATIVE=1        fail if the C extension does not build (CI)
set -euo pipefail
cd "$(dirname "$0")/.."

find_python() {
  local minor=$1 candidate root
  if candidate=$(command -v "python$minor" 2>/dev/null) && "$candidate" -c pass 2>/dev/null; then
    echo "$candidate"; return 0
  fi
  root=$(pyenv root 2>/dev/null || echo "${PYENV_ROOT:-$HOME/.pyenv}")
  for candidate in "$root"/versions/"$minor".*/bin/python"$minor"; do
    if [ -x "$candidate" ]; then echo "$candidate"; return 0; fi
  done
  return 1
}

ran=0
failed=()
for minor in 3.11 3.12 3.13; do
  if ! py=$(find_python "$minor"); then
    if [ "${TCC_REQUIRE_ALL_PYTHONS:-0}" = 1 ]; then
      echo "error: Python $minor not found" >&2; exit 1
    fi
    echo "== Python $minor not found; skipping"
    continue
  fi
  venv=".venv-$minor"
  echo "== Python $minor ($py)"
  [ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip >/dev/null
  "$venv/bin/python" -m pip install -q -e ".[test,openai]"
  # Byte-compile as a regular install does: the tests start `tcc` in thousands of
  # subprocesses, and where PYTHONDONTWRITEBYTECODE=1 is set each would compile tcc from
  # source again (~0.25 s apiece).  Stale .pyc files are recompiled by mtime as usual.
  "$venv/bin/python" -m compileall -q -j 0 src tests benchmarks examples >/dev/null
  if "$venv/bin/python" -m pytest -p no:cacheprovider "$@"; then
    ran=$((ran + 1))
  else
    failed+=("$minor")
  fi
done
if [ "${#failed[@]}" -gt 0 ]; then
  echo "FAILED on Python ${failed[*]}" >&2; exit 1
fi
if [ "$ran" -eq 0 ]; then
  echo "error: no supported Python (3.11-3.13) found" >&2; exit 1
fi
echo "tests passed on $ran interpreter(s)"
