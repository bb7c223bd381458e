"""Run the peer recovery benchmarks and print a table.

    python -m benchmarks.peers.run_peers --n 100 1000 --work-ms 0 0.5 --repeats 5 \
        --out peers.json --workdir /tmp/peers

Configurations run peer after peer (A B A B...) so that both see the same machine state;
peers that are not installed are skipped with a message. One work calibration is shared
by every peer.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import statistics
import sys
import tempfile

from . import _agent, dbos_peer, langgraph_peer

MODULES = {"dbos": dbos_peer, "langgraph": langgraph_peer, **langgraph_peer.VARIANTS}  # + "langgraph delta"


def _ms(x: float) -> str:
    return f"{x * 1000:.1f}"


def table(results: list[dict]) -> str:
    cols = [
        "peer", "regime", "work ms", "N", "whole-process s, median [min-max]", "in-process s",
        "in-process excl. poll s", "DBOS poll wait s", "per-step overhead ms", "bytes after N",
        "bytes/step", "final digest", "dup. effects",
    ]
    rows = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in results:
        b = r["breakdown_s"]
        w = r["whole_process_s"]
        med = statistics.median
        cells = [
            f"{r['peer']} {r['version']}",
            r["regime"],
            f"{r['work_ms']:g}",
            str(r["n"]),
            f"{med(w):.3f} [{min(w):.3f}-{max(w):.3f}]",
            f"{med(r['in_process_s']):.4f}",
            f"{med(b['in_process_excl_poll_s']):.4f}" if "in_process_excl_poll_s" in b else "-",
            f"{med(b['queue_poll_wait_s']):.3f}" if "queue_poll_wait_s" in b else "-",
            _ms(r["per_step_overhead_s"]),
            f"{r['storage_bytes']:,}",
            f"{r['storage_bytes'] / r['n']:,.0f}",
            r["final_result"]["digest"],
            str(r["duplicate_effects"]),
        ]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--regime", nargs="+", default=["const"], choices=["const", "grow"])
    ap.add_argument("--work-ms", type=float, nargs="+", default=[0.0, 0.5])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--peers", nargs="+", default=list(MODULES), choices=list(MODULES))
    ap.add_argument("--workdir", type=pathlib.Path, default=None)
    ap.add_argument("--out", type=pathlib.Path, default=None)
    args = ap.parse_args(argv)

    peers = []
    for name in args.peers:
        if MODULES[name].available():
            peers.append(name)
        else:
            print(f"skipping {name}: not installed (pip install the [peers] extra)", file=sys.stderr)
    workdir = args.workdir or pathlib.Path(tempfile.mkdtemp(prefix="tcc-peers-"))
    iters = {w: _agent.calibrate_work(w) for w in args.work_ms}
    results = []
    for regime in args.regime:
        for work_ms in args.work_ms:
            for n in args.n:
                for name in peers:
                    print(f"{name} regime={regime} work_ms={work_ms:g} n={n} ...", file=sys.stderr, flush=True)
                    res = MODULES[name].measure(
                        n, regime=regime, work_ms=work_ms, repeats=args.repeats,
                        workdir=workdir / name, work_iters=iters[work_ms],
                    )
                    results.append(res)
                    if args.out:
                        args.out.write_text(json.dumps(results, indent=1))
                    shutil.rmtree(workdir / name, ignore_errors=True)
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
