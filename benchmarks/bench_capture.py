"""Capture benchmarks: tcc.dumps / tcc.loads against plain cloudpickle.

The workload is an agent coroutine suspended at an effect, holding a
transcript of chat messages and a dict of tool results sized to about 10 KiB,
100 KiB or 1 MiB.  The reference is ``cloudpickle.dumps/loads`` of the same
locals as a plain dict: what a framework that snapshots hand-picked state
pays.  tcc additionally captures the frames and compresses with zstd.

Two ways to run it:

    pytest benchmarks/bench_capture.py          # pytest-benchmark tables
    python benchmarks/bench_capture.py          # interleaved A/B table with ratios
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from typing import Any, Callable

import cloudpickle
import pytest

import tcc
from tcc.capture import dump_payload, load_payload

SIZES = {"10KiB": 10 * 1024, "100KiB": 100 * 1024, "1MiB": 1024 * 1024}


class Effect:
    def __init__(self, name: str, arg: Any) -> None:
        self.name, self.arg = name, arg

    def __await__(self) -> Any:
        return (yield self)


async def tool(name: str, arg: Any) -> Any:
    return await Effect(name, arg)


async def agent(transcript: list[dict[str, str]], results: dict[str, Any]) -> Any:
    step = 0
    for message in list(transcript):
        step += 1
        reply = await tool("llm", message["content"][:20])
        results[f"r{step}"] = reply
    return step


def make_state(nbytes: int) -> tuple[list[dict[str, str]], dict[str, Any]]:
    rng = random.Random(nbytes)
    words = ["agent", "tool", "result", "plan", "search", "token", "model", "fact"]
    transcript: list[dict[str, str]] = []
    results: dict[str, Any] = {}
    size = 0
    i = 0
    while size < nbytes:
        text = " ".join(rng.choice(words) for _ in range(30))
        role = "user" if i % 2 else "assistant"
        transcript.append({"role": role, "content": text})
        results[f"tool{i}"] = {"score": rng.random(), "hits": [rng.randrange(1000) for _ in range(8)]}
        size += len(text) + 8 * 4 + 40
        i += 1
    return transcript, results


def suspended_agent(nbytes: int) -> tuple[Any, dict[str, Any]]:
    transcript, results = make_state(nbytes)
    task = agent(transcript, results)
    task.send(None)
    return task, {"transcript": transcript, "results": results}


# ----------------------------------------------------------- pytest-benchmark


@pytest.fixture(params=list(SIZES), scope="module")
def state(request: Any) -> Any:
    task, plain = suspended_agent(SIZES[request.param])
    yield task, plain
    task.close()


def test_tcc_dumps(benchmark: Any, state: Any) -> None:
    task, _ = state
    benchmark.group = "dumps"
    blob = benchmark(tcc.dumps, task)
    benchmark.extra_info["bytes"] = len(blob)


def test_cloudpickle_dumps(benchmark: Any, state: Any) -> None:
    _, plain = state
    benchmark.group = "dumps"
    blob = benchmark(cloudpickle.dumps, plain)
    benchmark.extra_info["bytes"] = len(blob)


def test_tcc_loads(benchmark: Any, state: Any) -> None:
    task, _ = state
    blob = tcc.dumps(task)
    benchmark.group = "loads"
    benchmark(lambda: tcc.loads(blob).close())


def test_cloudpickle_loads(benchmark: Any, state: Any) -> None:
    _, plain = state
    blob = cloudpickle.dumps(plain)
    benchmark.group = "loads"
    benchmark(cloudpickle.loads, blob)


# ------------------------------------------------------ interleaved A/B table


def _time(fn: Callable[[], Any], reps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


def measure(rounds: int = 15) -> list[dict[str, Any]]:
    """Median per-operation times of each variant, interleaved A B A B..."""
    rows = []
    for label, nbytes in SIZES.items():
        task, plain = suspended_agent(nbytes)
        reps = max(1, 200_000 // nbytes)
        blob = tcc.dumps(task)
        payload = dump_payload(task)
        ref = cloudpickle.dumps(plain)
        variants: dict[str, Callable[[], Any]] = {
            "cloudpickle.dumps": lambda: cloudpickle.dumps(plain),
            "tcc.dumps": lambda: tcc.dumps(task),
            "tcc payload (no zstd)": lambda: dump_payload(task),
            "cloudpickle.loads": lambda: cloudpickle.loads(ref),
            "tcc.loads": lambda: tcc.loads(blob).close(),
            "tcc payload load": lambda: load_payload(payload).close(),
        }
        samples: dict[str, list[float]] = {k: [] for k in variants}
        for _ in range(rounds):
            for name, fn in variants.items():
                samples[name].append(_time(fn, reps))
        med = {k: statistics.median(v) for k, v in samples.items()}
        spread = {k: (max(v) - min(v)) / 2 for k, v in samples.items()}
        rows.append(
            {
                "state": label,
                "median_s": med,
                "spread_s": spread,
                "bytes": {"tcc": len(blob), "tcc_uncompressed": len(payload), "cloudpickle": len(ref)},
            }
        )
        task.close()
    return rows


def report(rows: list[dict[str, Any]]) -> str:
    lines = [
        f"Python {sys.version.split()[0]}; medians of interleaved rounds (ratio vs cloudpickle)",
        "",
        "| state | cloudpickle dumps | tcc.dumps | ratio | cloudpickle loads | tcc.loads | ratio "
        "| cloudpickle bytes | tcc bytes (zstd) | tcc bytes (raw) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        m, b = row["median_s"], row["bytes"]
        lines.append(
            f"| {row['state']} | {m['cloudpickle.dumps'] * 1e3:.3f} ms | {m['tcc.dumps'] * 1e3:.3f} ms "
            f"| {m['tcc.dumps'] / m['cloudpickle.dumps']:.2f}x "
            f"| {m['cloudpickle.loads'] * 1e3:.3f} ms | {m['tcc.loads'] * 1e3:.3f} ms "
            f"| {m['tcc.loads'] / m['cloudpickle.loads']:.2f}x "
            f"| {b['cloudpickle']:,} | {b['tcc']:,} | {b['tcc_uncompressed']:,} |"
        )
    lines.append("")
    lines.append("Without compression (pickle work only):")
    for row in rows:
        m = row["median_s"]
        lines.append(
            f"- {row['state']}: dumps {m['tcc payload (no zstd)'] / m['cloudpickle.dumps']:.2f}x, "
            f"loads {m['tcc payload load'] / m['cloudpickle.loads']:.2f}x of cloudpickle"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    # Re-import under the module's own name so that the agent's functions are
    # pickled by reference, as they are for a script run by `tcc run`, rather
    # than by value as `__main__` functions.
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
    import bench_capture

    print(bench_capture.report(bench_capture.measure()))
