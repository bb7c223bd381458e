"""Coverage-guided fuzzing (atheris) of tcc.loads and the store decoders finds nothing.

Each target of ``fuzz_atheris.py`` runs in a child process for
``TCC_ATHERIS_SECONDS`` (default 60) from a fresh corpus seeded with real
snapshots and records; the child exits 0 only when libFuzzer saw no finding
(an undocumented exception, a crash, a timeout or running out of memory).
Findings are saved under ``TCC_ATHERIS_FINDINGS`` (default: the test's
temporary directory), and the failure message names them.  Slow tier only.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parent / "fuzz_atheris.py"
SECONDS = int(os.environ.get("TCC_ATHERIS_SECONDS", "60"))

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("atheris") is None,
        reason="atheris is not installed for this interpreter (pip install atheris; "
        "wheels exist for CPython 3.11-3.13 on x86_64 Linux)",
    ),
]


@pytest.mark.parametrize("target", ["loads", "resealed", "record"])
def test_fuzz_target_finds_nothing(target: str, tmp_path: pathlib.Path) -> None:
    """A fuzzing run of the target ends with exit 0: no finding of any kind."""
    findings = pathlib.Path(os.environ.get("TCC_ATHERIS_FINDINGS", tmp_path / "findings"))
    env = dict(os.environ, TCC_ATHERIS_FINDINGS=str(findings), TCC_ATHERIS_KEEP_GOING="0")
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            target,
            f"-max_total_time={SECONDS}",
            str(tmp_path / "corpus"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=SECONDS + 600,  # building the seeds and instrumenting take a while
    )
    stats = [line for line in proc.stderr.splitlines() if line.startswith("tcc-stats")]
    print(stats[-1] if stats else "(no tcc-stats line)")
    saved = sorted(p.name for p in findings.glob(f"{target}-*")) if findings.is_dir() else []
    assert proc.returncode == 0, (
        f"{target}: exit {proc.returncode}; findings in {findings}: {saved}\n"
        f"stderr tail:\n{proc.stderr[-4000:]}"
    )
