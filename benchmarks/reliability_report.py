"""Run the reliability campaigns and print their figures.

    python benchmarks/reliability_report.py            # the CI tier (minutes)
    python benchmarks/reliability_report.py --slow     # the slow tier (sizes from TCC_* env vars)

Runs the crash campaign (tests/runtime/test_crash.py), the snapshot fuzzers
(tests/capture/test_fuzz.py) and tests/reliability/ under pytest with output
shown, then prints every summary line the suites emit (``kills=``, ``fuzz:``,
``corruption:``, ``concurrency:``, ``faults:``, ``oscrash:``) and pytest's own
closing line.
"""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SUITES = ["tests/runtime/test_crash.py", "tests/capture/test_fuzz.py", "tests/store/test_lmdbcheck.py",
          "tests/reliability"]
FIGURES = re.compile(
    r"^(kills=|fuzz:|corruption:|concurrency:|faults:|oscrash:|=+ .*(passed|failed).*=+$|\d+ (passed|failed)\b)"
)


def main(argv: list[str]) -> int:
    marker = "slow or not slow" if "--slow" in argv else "not slow"
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-s", "-rxX", "-m", marker, *SUITES]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    lines = [line.strip() for line in proc.stdout.splitlines()]
    print(f"reliability report ({'slow' if '--slow' in argv else 'CI'} tier), exit {proc.returncode}")
    for line in lines:
        if FIGURES.search(line.lstrip(".xsF ")):
            print("  " + line.lstrip(".xsF "))
    xfails = [line for line in lines if line.startswith("XFAIL")]
    if xfails:
        print(f"  known limits (strict xfail): {len(xfails)}")
        for line in xfails:
            print("   - " + line[len("XFAIL "):][:160])
    if proc.returncode != 0:
        sys.stdout.write(proc.stdout[-3000:])
        sys.stderr.write(proc.stderr[-3000:])
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
