#!/usr/bin/env bash
# The snapshot fuzz campaign with tcc's C extensions built under AddressSanitizer (issue #24).
#
#   scripts/asan_fuzz.sh                      # TCC_FUZZ_MUTANTS=100000 per layer (~7 min on 2 cores)
#   TCC_FUZZ_MUTANTS=2000 scripts/asan_fuzz.sh  # a quick look
#
# What it does, all outside the repository except for the two artifacts it writes:
#
# 1. copies the working tree's build inputs (setup.py, pyproject.toml, native/, src/; committed
#    or not) to a mktemp directory, makes a throwaway virtualenv there from CPython 3.12
#    (TCC_ASAN_PYTHON overrides), and installs tcc into it with both C extensions compiled with
#    CFLAGS="$ASAN_CFLAGS" LDFLAGS=-fsanitize=address (plain setuptools: CFLAGS/LDFLAGS from the
#    environment reach the compile and link lines; setup.py is not changed) and
#    TCC_REQUIRE_NATIVE=1 (a failed build is fatal, never a silent fallback);
# 2. checks that ASan is live: both .so files link libasan and carry __asan_report_* calls, and a
#    throwaway extension built with the same flags has a heap-buffer-overflow and a
#    use-after-free of a small Python object caught under the same LD_PRELOAD/ASAN_OPTIONS
#    (and, as a control, the use-after-free missed without PYTHONMALLOC=malloc);
# 3. runs, from the repository, with libasan preloaded (the interpreter is not instrumented):
#      tests/capture/test_fuzz.py           TCC_FUZZ_MUTANTS mutants per layer (sealed, payload,
#                                           record, structured), each layer in a child process
#      tests/capture/test_flow.py           the native frame checker's crash oracle (NULL / extra /
#                                           missing value-stack slots resumed, thrown into, closed)
#      tests/capture/test_drift.py          truncations and every single-bit flip of a snapshot
#      tests/runtime/test_upgrade_fuzz.py   frames written into randomly edited code, then resumed
#      tests/reliability/test_corruption.py damaged LMDB data files read through the store
#    Children inherit the environment, so every child interpreter runs under ASan too.
# 4. writes paper/data/asan-fuzz-<UTC timestamp>.json (raw figures) and .log (the pytest output
#    followed by every ASan report file; trimmed to 2 MB).
#
# Settings, and why:
#   ASAN_OPTIONS detect_leaks=0         CPython's own allocations (interned strings, static
#                                       types, arenas kept to exit) would be reported as leaks
#                abort_on_error=1       a finding kills the child with SIGABRT, which the tests
#                                       report as a crash of that layer
#                allocator_may_return_null=1, max_allocation_size_mb=4096
#                                       a mutated length field asking for more than 4 GiB gets
#                                       NULL (MemoryError), as test_fuzz's RLIMIT_AS of 4 GiB
#                                       gives without ASan (see the next point)
#                log_path               one report file per process, kept whole (the tests only
#                                       quote the last 2000 characters of a child's stderr)
#   RLIMIT_AS    test_fuzz.py sets RLIMIT_AS=4 GiB in its children; ASan must reserve ~16 TiB of
#                shadow address space and cannot start under it.  A pytest plugin written into
#                the temporary directory replaces test_fuzz.limit_memory with a no-op for this
#                run; the tests themselves are unchanged.
#   PYTHONMALLOC=malloc  without it pymalloc serves every object <= 512 bytes from its own arenas,
#                where ASan sees no bounds and no frees (step 2 shows the difference).
#
# Environment: TCC_FUZZ_MUTANTS (default 100000), TCC_ASAN_PYTHON (the interpreter),
# TCC_ASAN_KEEP=1 (keep the temporary directory), TCC_ASAN_TESTS (override the test list).
# Exit status: 0 when every test passed and no ASan report was written, 1 otherwise; the
# artifacts are written either way.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"

MUTANTS=${TCC_FUZZ_MUTANTS:-100000}
ASAN_CFLAGS="-fsanitize=address -fno-omit-frame-pointer -g -O1"
ASAN_LDFLAGS="-fsanitize=address"
TESTS=${TCC_ASAN_TESTS:-"tests/capture/test_fuzz.py tests/capture/test_flow.py tests/capture/test_drift.py tests/runtime/test_upgrade_fuzz.py tests/reliability/test_corruption.py"}

find_python() {
  local candidate root
  if [ -n "${TCC_ASAN_PYTHON:-}" ]; then echo "$TCC_ASAN_PYTHON"; return 0; fi
  if candidate=$(command -v python3.12 2>/dev/null) && "$candidate" -c pass 2>/dev/null; then
    echo "$candidate"; return 0
  fi
  root=$(pyenv root 2>/dev/null || echo "${PYENV_ROOT:-$HOME/.pyenv}")
  for candidate in "$root"/versions/3.12.*/bin/python3.12; do
    if [ -x "$candidate" ]; then echo "$candidate"; return 0; fi
  done
  return 1
}
PY=$(find_python) || { echo "error: no CPython 3.12 found (set TCC_ASAN_PYTHON)" >&2; exit 2; }
LIBASAN=$(gcc -print-file-name=libasan.so)
[ -e "$LIBASAN" ] || { echo "error: gcc has no libasan.so ($LIBASAN)" >&2; exit 2; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/tcc-asan-fuzz.XXXXXX")
cleanup() {
  if [ "${TCC_ASAN_KEEP:-0}" = 1 ]; then echo "== kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
mkdir -p "$WORK/src" "$WORK/asan" "$WORK/plugin" "$WORK/canary" "$WORK/canary-asan"

STAMP=$(date -u +%Y%m%d-%H%M%S)
OUT_JSON="$REPO/paper/data/asan-fuzz-$STAMP.json"
OUT_LOG="$REPO/paper/data/asan-fuzz-$STAMP.log"
START=$(date +%s.%N)
LOAD_START=$(cut -d" " -f1-3 /proc/loadavg)

echo "== work directory $WORK; interpreter $PY"
git rev-parse HEAD > "$WORK/git-sha"
git status --porcelain > "$WORK/git-status"

# -- 1. the build --------------------------------------------------------------------------------
git ls-files -z -co --exclude-standard -- setup.py pyproject.toml 'README*' 'LICENSE*' native src \
  | while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done \
  | tar --null -T - -cf - | tar -xf - -C "$WORK/src"
"$PY" -m venv "$WORK/venv"
VPY="$WORK/venv/bin/python"
"$VPY" -m pip install -q "setuptools>=77" wheel pytest hypothesis pytest-timeout cryptography > "$WORK/pip.log" 2>&1 \
  || { cat "$WORK/pip.log" >&2; exit 2; }
( cd "$WORK/src" && CFLAGS="$ASAN_CFLAGS" LDFLAGS="$ASAN_LDFLAGS" TCC_REQUIRE_NATIVE=1 \
    "$VPY" -m pip install -v --no-build-isolation . > "$WORK/build.log" 2>&1 ) \
  || { tail -50 "$WORK/build.log" >&2; echo "error: the ASan build failed" >&2; exit 2; }
grep -E '^ *(gcc|cc|x86_64-linux-gnu-gcc) ' "$WORK/build.log" | sed 's/^ *//' > "$WORK/compile-lines" || true
SITE=$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')

# -- 2. is ASan live? ----------------------------------------------------------------------------
for so in "$SITE"/tcc/_native.*.so "$SITE"/tcc/store/_fast.*.so; do
  echo "$so"
  ldd "$so" | grep -i asan || echo "  (no libasan in ldd)"
  echo "  __asan_report_* calls: $(nm -D --undefined-only "$so" | grep -c '__asan_report_' || true)"
done > "$WORK/so-check"
cat "$WORK/so-check"

cat > "$WORK/canary/canary.c" <<'EOF'
/* A deliberate heap-buffer-overflow and a use-after-free of a small Python object. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdlib.h>

static PyObject *overflow(PyObject *self, PyObject *args) {
    volatile char *p = malloc(16);
    p[16] = 1;  /* one byte past the end */
    free((void *)p);
    Py_RETURN_NONE;
}

static PyObject *use_after_free(PyObject *self, PyObject *args) {
    /* 53 bytes: pymalloc's unless PYTHONMALLOC=malloc (bytes objects have no free list) */
    PyObject *b = PyBytes_FromStringAndSize("0123456789abcdef0123", 20);
    volatile char *s = PyBytes_AS_STRING(b);
    Py_DECREF(b);
    return PyLong_FromLong(s[0]);  /* read of freed memory */
}

static PyMethodDef methods[] = {
    {"overflow", overflow, METH_NOARGS, NULL},
    {"use_after_free", use_after_free, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "asan_canary", NULL, -1, methods};
PyMODINIT_FUNC PyInit_asan_canary(void) { return PyModule_Create(&module); }
EOF
cat > "$WORK/canary/setup.py" <<'EOF'
from setuptools import Extension, setup
setup(name="asan-canary", version="0", ext_modules=[Extension("asan_canary", ["canary.c"])])
EOF
( cd "$WORK/canary" && CFLAGS="$ASAN_CFLAGS" LDFLAGS="$ASAN_LDFLAGS" \
    "$VPY" setup.py -q build_ext --inplace > "$WORK/canary/build.log" 2>&1 )

# the campaign's environment (the canary uses the same, with its own log_path)
ASAN_BASE="detect_leaks=0:abort_on_error=1:allocator_may_return_null=1:max_allocation_size_mb=4096"
ASAN_OPTS="$ASAN_BASE:log_path=$WORK/asan/asan"
canary() {  # name, function, PYTHONMALLOC value -> "<exit status> <first ASan error line>"
  local name=$1 fn=$2 pymalloc=$3 rc=0
  env -u PYTHONMALLOC ${pymalloc:+PYTHONMALLOC=$pymalloc} LD_PRELOAD="$LIBASAN" \
      ASAN_OPTIONS="$ASAN_BASE:log_path=$WORK/canary-asan/$name" PYTHONPATH="$WORK/canary" \
      "$VPY" -c "import asan_canary; print(asan_canary.$fn())" > /dev/null 2>&1 || rc=$?
  echo "$rc $(grep -h -m1 -o 'ERROR: AddressSanitizer: [a-z-]*' "$WORK/canary-asan/$name".* 2>/dev/null || echo none)"
}
CANARY_OVERFLOW=$(canary overflow overflow malloc)
CANARY_UAF=$(canary uaf use_after_free malloc)
CANARY_UAF_PYMALLOC=$(canary uaf-pymalloc use_after_free "")
echo "canary: overflow -> $CANARY_OVERFLOW; use-after-free -> $CANARY_UAF;" \
     "use-after-free without PYTHONMALLOC=malloc -> $CANARY_UAF_PYMALLOC"

# -- 3. the campaign -----------------------------------------------------------------------------
cat > "$WORK/plugin/tcc_asan_plugin.py" <<'EOF'
"""pytest plugin for scripts/asan_fuzz.sh: the ASan build must be the one imported, and
test_fuzz's RLIMIT_AS (which ASan's shadow memory cannot start under) is lifted."""
import os

import pytest


def pytest_sessionstart(session):
    import tcc._native
    import tcc.store._fast

    for mod in (tcc._native, tcc.store._fast):
        print(f"asan-fuzz: {mod.__name__} from {mod.__file__}", flush=True)
        if not mod.__file__.startswith(os.environ["TCC_ASAN_SITE"]):
            raise pytest.UsageError(f"{mod.__name__} is not the ASan build: {mod.__file__}")


def _no_rlimit_as():
    pass  # ASAN_OPTIONS max_allocation_size_mb=4096 stands in for RLIMIT_AS=4 GiB


def pytest_collection_finish(session):
    patched = set()
    for item in session.items:
        mod = getattr(item, "module", None)
        if mod is not None and callable(getattr(mod, "limit_memory", None)) and id(mod) not in patched:
            mod.limit_memory = _no_rlimit_as
            patched.add(id(mod))
            print(f"asan-fuzz: {mod.__name__}.limit_memory replaced (no RLIMIT_AS)", flush=True)
EOF

# shellcheck disable=SC2086
PYTEST_ARGS=(-p no:cacheprovider -p tcc_asan_plugin -s -v -rA --durations=20
             --basetemp="$WORK/pytest" --junitxml="$WORK/junit.xml" $TESTS)
CMD="cd $REPO && TCC_FUZZ_MUTANTS=$MUTANTS PYTHONMALLOC=malloc PYTHONDONTWRITEBYTECODE=1 LD_PRELOAD=$LIBASAN ASAN_OPTIONS=$ASAN_OPTS PYTHONPATH=$WORK/plugin $VPY -m pytest ${PYTEST_ARGS[*]}"
echo "== $CMD"
T0=$(date +%s.%N)
set +e
env TCC_FUZZ_MUTANTS="$MUTANTS" TCC_ASAN_SITE="$SITE" PYTHONMALLOC=malloc PYTHONDONTWRITEBYTECODE=1 \
    LD_PRELOAD="$LIBASAN" ASAN_OPTIONS="$ASAN_OPTS" PYTHONPATH="$WORK/plugin" \
    "$VPY" -m pytest "${PYTEST_ARGS[@]}" 2>&1 | tee "$WORK/pytest.out"
PYTEST_RC=${PIPESTATUS[0]}
set -e
T1=$(date +%s.%N)

# -- 4. the artifacts ----------------------------------------------------------------------------
{
  cat "$WORK/pytest.out"
  echo
  echo "==================== ASan report files ($WORK/asan/asan.<pid>) ===================="
  for f in "$WORK"/asan/asan.*; do
    [ -e "$f" ] || { echo "(none)"; break; }
    echo "---- $(basename "$f"): $(grep -c 'failed to allocate' "$f" || true) allocation warning(s)" \
         "(allocator_may_return_null: a request over max_allocation_size_mb returned NULL)"
    grep -v 'WARNING: AddressSanitizer failed to allocate' "$f" || true
  done
} > "$WORK/full.log"
# the failing tests' mutant files, for reproduction
find "$WORK/pytest" -name crasher.txt -exec sh -c 'echo "---- $1"; cat "$1"' _ {} \; >> "$WORK/full.log" 2>/dev/null || true

mkdir -p "$REPO/paper/data"
LIMIT=$((2 * 1024 * 1024))
if [ "$(stat -c %s "$WORK/full.log")" -gt "$LIMIT" ]; then
  { head -c $((LIMIT / 2)); echo; echo "[... trimmed to 2 MB: middle left out ...]"; } < "$WORK/full.log" > "$OUT_LOG"
  tail -c $((LIMIT / 2)) "$WORK/full.log" >> "$OUT_LOG"
else
  cp "$WORK/full.log" "$OUT_LOG"
fi

END=$(date +%s.%N)
LOAD_END=$(cut -d" " -f1-3 /proc/loadavg)
export LOAD_START LOAD_END REPO WORK PY VPY LIBASAN MUTANTS ASAN_CFLAGS ASAN_LDFLAGS ASAN_OPTS CMD PYTEST_RC T0 T1 START END \
  STAMP OUT_JSON OUT_LOG CANARY_OVERFLOW CANARY_UAF CANARY_UAF_PYMALLOC TESTS
env -u LD_PRELOAD "$VPY" - <<'EOF'
import glob, json, os, platform, re, subprocess, xml.etree.ElementTree as ET

E = os.environ
W = E["WORK"]


def read(path):
    with open(path, errors="replace") as f:
        return f.read()


out = read(f"{W}/pytest.out")
layers = {}
for m in re.finditer(r"^fuzz: layer=(\w+) mutants=(\d+) signals=(\d+) outcomes=(\{.*\})$", out, re.M):
    layers[m.group(1)] = {"mutants": int(m.group(2)), "signals": int(m.group(3)),
                          "outcomes": json.loads(m.group(4))}
corruption = re.findall(r"^corruption: (.*)$", out, re.M)

tests, counts = [], {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
if os.path.exists(f"{W}/junit.xml"):
    for case in ET.parse(f"{W}/junit.xml").getroot().iter("testcase"):
        outcome = "passed"
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                outcome = {"failure": "failed"}.get(tag, tag)
                message = (el.get("message") or "")[:300]
                break
        else:
            message = None
        counts[outcome] += 1
        entry = {"test": f"{case.get('classname')}::{case.get('name')}", "outcome": outcome,
                 "seconds": round(float(case.get("time") or 0), 2)}
        if message:
            entry["message"] = message
        tests.append(entry)
counts["total"] = len(tests)

reports = sorted(glob.glob(f"{W}/asan/asan.*"))
texts = {os.path.basename(p): read(p) for p in reports}
error_lines = [l for t in texts.values() for l in t.splitlines() if "ERROR: AddressSanitizer" in l]
check_lines = [l for t in texts.values() for l in t.splitlines() if "AddressSanitizer: CHECK failed" in l]
warnings = sum(t.count("WARNING: AddressSanitizer failed to allocate") for t in texts.values())
in_output = [l for l in out.splitlines() if "ERROR: AddressSanitizer" in l or "AddressSanitizer: CHECK failed" in l]


def status(s):
    rc, _, what = s.partition(" ")
    return {"exit_status": int(rc), "asan_report": what}


so_check = read(f"{W}/so-check")
canary_overflow, canary_uaf, canary_uaf_pymalloc = (
    status(E["CANARY_OVERFLOW"]), status(E["CANARY_UAF"]), status(E["CANARY_UAF_PYMALLOC"]))
links = so_check.count("libasan") >= 2
instrumented = all(int(n) > 0 for n in re.findall(r"__asan_report_\* calls: (\d+)", so_check))
caught = ("heap-buffer-overflow" in canary_overflow["asan_report"]
          and "heap-use-after-free" in canary_uaf["asan_report"])

git_status = read(f"{W}/git-status").splitlines()
gcc = subprocess.run(["gcc", "--version"], capture_output=True, text=True).stdout.splitlines()[0]
pyver = subprocess.run([E["VPY"], "-c", "import sys; print(sys.version)"], capture_output=True,
                       text=True, env={k: v for k, v in E.items() if k != "LD_PRELOAD"}).stdout.strip()
asan_reported = bool(error_lines or check_lines or in_output)

doc = {
    "artifact": "tcc ASan fuzz campaign (scripts/asan_fuzz.sh, issue #24)",
    "timestamp_utc": E["STAMP"],
    "git": {"sha": read(f"{W}/git-sha").strip(), "dirty": bool(git_status),
            "dirty_files": git_status,
            "note": "the build used the working tree (committed or not) of the files listed in "
                    "build.sources; the tests ran from the repository's working tree"},
    "python": {"version": pyver, "interpreter": E["PY"], "instrumented": False},
    "gcc": gcc,
    "kernel": " ".join(platform.uname()[i] for i in (0, 2, 3, 4)),
    "cpus": os.cpu_count(),
    "load_average_1_5_15min": {"start": E["LOAD_START"], "end": E["LOAD_END"],
                               "note": "other work on the machine shares the CPUs"},
    "build": {
        "sources": ["setup.py", "pyproject.toml", "README*", "LICENSE*", "native/", "src/"],
        "CFLAGS": E["ASAN_CFLAGS"], "LDFLAGS": E["ASAN_LDFLAGS"], "TCC_REQUIRE_NATIVE": "1",
        "how": "pip install --no-build-isolation . in a copy of the tree, CFLAGS/LDFLAGS from the "
               "environment (setup.py unchanged)",
        "compile_lines": read(f"{W}/compile-lines").splitlines(),
    },
    "command": E["CMD"],
    "tests_run": E["TESTS"].split(),
    "environment": {
        "TCC_FUZZ_MUTANTS": int(E["MUTANTS"]),
        "LD_PRELOAD": E["LIBASAN"],
        "ASAN_OPTIONS": E["ASAN_OPTS"],
        "PYTHONMALLOC": "malloc",
        "leak_detection": "off (detect_leaks=0): CPython's own allocations that live until exit "
                          "would be reported as leaks",
        "harness_adjustment": "test_fuzz.limit_memory (RLIMIT_AS=4 GiB in the fuzz children) is "
                              "replaced by a no-op through a pytest plugin: ASan reserves ~16 TiB "
                              "of shadow address space and cannot start under RLIMIT_AS. "
                              "allocator_may_return_null=1:max_allocation_size_mb=4096 makes a "
                              "request over 4 GiB fail with MemoryError instead. Test assertions "
                              "are unchanged.",
    },
    "mutants_per_layer": layers,
    "mutants_per_layer_note": "test_fuzz.py's own 'fuzz:' lines (one per layer and child process)",
    "corruption_campaigns": corruption,
    "tests": counts,
    "per_test": tests,
    "pytest_exit_status": int(E["PYTEST_RC"]),
    "wall_time_seconds": {"pytest": round(float(E["T1"]) - float(E["T0"]), 1),
                          "total_with_build": round(float(E["END"]) - float(E["START"]), 1)},
    "asan": {
        "reported_anything": asan_reported,
        "error_reports": len(error_lines),
        "check_failures": len(check_lines),
        "first_lines": (error_lines + check_lines)[:10],
        "lines_in_pytest_output": in_output[:10],
        "allocation_warnings": warnings,
        "allocation_warnings_note": "allocator_may_return_null=1: requests over 4 GiB (mutated "
                                    "length fields) returned NULL -> MemoryError; not findings, but "
                                    "they show the fuzz children ran on ASan's allocator",
        "report_files": {k: len(v.splitlines()) for k, v in texts.items()},
    },
    "asan_active_check": {
        "extensions_link_libasan": links,
        "extensions_instrumented": instrumented,
        "ldd_and_nm": so_check.splitlines(),
        "canary_heap_buffer_overflow": canary_overflow,
        "canary_use_after_free_PYTHONMALLOC_malloc": canary_uaf,
        "canary_use_after_free_pymalloc_control": canary_uaf_pymalloc,
        "canary": "a throwaway extension built with the same CFLAGS/LDFLAGS, run under the same "
                  "LD_PRELOAD and ASAN_OPTIONS: a one-byte write past a malloc(16) block, and a "
                  "read of a freed 20-byte bytes object (53 bytes, which pymalloc serves "
                  "without PYTHONMALLOC=malloc: the control run shows ASan blind there)",
        "active": links and instrumented and caught,
    },
    "log": os.path.relpath(E["OUT_LOG"], E["REPO"]),
}
doc["result"] = ("clean" if counts["failed"] == counts["error"] == 0 and counts["total"] > 0
                 and not asan_reported and int(E["PYTEST_RC"]) == 0 else "findings or failures")
with open(E["OUT_JSON"], "w") as f:
    json.dump(doc, f, indent=2)
    f.write("\n")
print(f"== {doc['result']}: {counts}; ASan reports: {len(error_lines)} error(s), "
      f"{len(check_lines)} CHECK failure(s); ASan active: {doc['asan_active_check']['active']}")
EOF
echo "== wrote $OUT_JSON"
echo "== wrote $OUT_LOG"

if [ "$PYTEST_RC" -ne 0 ] || grep -qs -e 'ERROR: AddressSanitizer' -e 'AddressSanitizer: CHECK failed' "$WORK"/asan/asan.*; then
  TCC_ASAN_KEEP=1  # keep the mutant files and report files for reproduction
  exit 1
fi
