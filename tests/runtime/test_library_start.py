"""``tcc.start``/``tcc.resume``: a durable run of a module's function, from Python.

The crash tests kill the process for real (``TCC_TEST_KILL_AFTER``: SIGKILL right after the
K-th journaled step) and check what another process makes of the store.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap

import pytest

import tcc
import tcc.store
from tcc import errors

AGENT = '''
import tcc
import tcc.store

CALLS = []

@tcc.effect
def double(x):
    return x * 2

async def main(topic, n):
    out = []
    for i in range(n):
        out.append(await double(i))
    return {"topic": topic, "out": out}
'''


@pytest.fixture
def project(tmp_path: pathlib.Path) -> pathlib.Path:
    pkg = tmp_path / "proj" / "myagents"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "agent.py").write_text(textwrap.dedent(AGENT))
    return tmp_path / "proj"


def _python(project: pathlib.Path, code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=project, text=True,
                          capture_output=True, timeout=120, env={**os.environ, **(env or {})})


def test_start_runs_a_module_function_and_records_its_entry(project: pathlib.Path) -> None:
    proc = _python(project, """
        import json, tcc
        from myagents import agent
        out = tcc.start(agent.main, "t", 3, run_id="one", store="store")
        print(json.dumps([out.status, out.result]))
    """)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == ["completed", {"topic": "t", "out": [0, 2, 4]}]
    with tcc.store.open_store(project / "store", create=False) as store:
        assert store.get_run("one").entry == "myagents.agent:main"


@pytest.mark.parametrize("how", ["tcc resume", "tcc.start again", "tcc.resume"])
def test_a_killed_library_run_resumes_in_another_process(project: pathlib.Path, how: str) -> None:
    start = """
        import tcc
        from myagents import agent
        out = tcc.start(agent.main, "k", 5, run_id="crash", store="store")
        print(out.status, out.result)
    """
    killed = _python(project, start, {"TCC_TEST_KILL_AFTER": "2"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    if how == "tcc resume":
        tcc_cli = [sys.executable, "-m", "tcc", "resume", "--store", "store", "--json", "crash"]
        proc = subprocess.run(tcc_cli, cwd=project, text=True, capture_output=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        result = json.loads(proc.stdout)["result"]
    else:
        code = start if how == "tcc.start again" else """
            import tcc
            out = tcc.resume("crash", store="store")
            print(out.status, out.result)
        """
        proc = _python(project, code)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith("completed ")
        result = eval(proc.stdout.split(" ", 1)[1])  # noqa: S307 - our own repr of a dict
    assert result == {"topic": "k", "out": [0, 2, 4, 6, 8]}
    with tcc.store.open_store(project / "store", create=False) as store:
        calls = [r for r in store.journal("crash") if r.kind == "intent"]
    assert len(calls) == 5  # the two before the kill were not issued again


def test_start_again_with_other_arguments_is_refused(project: pathlib.Path) -> None:
    killed = _python(project, """
        import tcc
        from myagents import agent
        tcc.start(agent.main, "k", 5, run_id="r", store="store")
    """, {"TCC_TEST_KILL_AFTER": "1"})
    assert killed.returncode == -signal.SIGKILL
    proc = _python(project, """
        import tcc
        from myagents import agent
        tcc.start(agent.main, "other", 5, run_id="r", store="store")
    """)
    assert proc.returncode == 1
    assert "exists and is running, but as myagents.agent:main" in proc.stderr


def test_a_function_of_the_main_script_becomes_a_script_entry(tmp_path: pathlib.Path) -> None:
    script = tmp_path / "standalone.py"
    script.write_text(textwrap.dedent(AGENT) + textwrap.dedent("""
        if __name__ == "__main__":
            out = tcc.start(main, "m", 2, run_id="m", store="store")
            print(out.status)
    """))
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, text=True,
                          capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "completed"
    with tcc.store.open_store(tmp_path / "store", create=False) as store:
        assert store.get_run("m").entry == f"{script}:main"


def test_functions_that_cannot_be_imported_by_name_are_refused(tmp_path: pathlib.Path) -> None:
    async def local(x: int) -> int:
        return x

    with pytest.raises(errors.UsageError, match="not a module-level function"):
        tcc.start(local, 1, store=tmp_path / "s")
    with pytest.raises(errors.UsageError, match="not a module-level function|cannot be named"):
        tcc.start(lambda: None, store=tmp_path / "s")


def test_inspect_finds_the_source_of_a_module_entry(project: pathlib.Path) -> None:
    killed = _python(project, """
        import tcc
        from myagents import agent
        tcc.start(agent.main, "k", 5, run_id="i", store="store")
    """, {"TCC_TEST_KILL_AFTER": "2"})
    assert killed.returncode == -signal.SIGKILL
    proc = subprocess.run([sys.executable, "-m", "tcc", "inspect", "--store", "store", "--json", "i"],
                          cwd=project, text=True, capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    main = doc["frames"][0]
    assert main["function"] == "main"
    assert main["file"] == str(project / "myagents" / "agent.py")
    assert "await double(i)" in main["source"]
