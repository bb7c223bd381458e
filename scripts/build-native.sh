#!/usr/bin/env bash
# Rebuild tcc._native in place for each given interpreter (development helper).
set -euo pipefail
cd "$(dirname "$0")/.."
for py in "$@"; do
  TCC_REQUIRE_NATIVE=1 "$py" setup.py -q build_ext --inplace >/dev/null
done
