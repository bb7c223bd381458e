"""Real peers (DBOS, LangGraph) running the same N-step agent as tcc's benchmark, side by side.

Agent contract (mirror this exactly in tcc's benchmark agent; reference code: ``_agent.py``)
================================================================================

Parameters: ``n`` steps, ``regime`` in {"const", "grow", "mutate"}, ``iters`` of busy work per step
(``iters = _agent.calibrate_work(work_ms)``; pass the same ``work_iters`` to every peer and to
tcc so all do identical CPU work).

State before step 0::

    {"i": 0, "ok": True, "last": ""}                       # regime "const"
    {"i": 0, "ok": True, "last": "", "transcript": []}     # regime "grow"
    {"i": 0, "ok": True, "last": "", "memory": {}}         # regime "mutate"

For i in 0..n-1, in this order:

1. **work** (workflow code between effects, e.g. prompt building): ``busy_work(iters)``::

       h = b"tcc-benchmark-work"
       for _ in range(iters): h = hashlib.sha256(h).digest()

2. **the step** = the one durable effect: ``out = fake_llm(i)`` which returns ``f"out-{i}"``.
   It is the recorded unit: a ``@DBOS.step``, a LangGraph node superstep, a ``@tcc.effect``.
   (The harness also appends ``b"%d\\n" % i`` to an effect log inside the step, after the
   crash/measure hook, to count executions; mirroring that is optional.)
3. **state update**::

       state["ok"] = state["ok"] and state["i"] == i and out == f"out-{i}"
       state["i"] = i + 1
       state["last"] = out
       # regime "grow": one chat message per step (``transcript_entry``: a dict with role,
       # name=out and content, real prose from the stdlib's docstrings, or on every third step
       # a 1-8 KiB tool output of stdlib source text; ~1.7 KB on average)
       state["transcript"].append(transcript_entry(i, out))
       # regime "mutate": a 16-slot scratchpad, slot i % 16 rewritten with that message
       state["memory"][f"slot-{i % 16}"] = transcript_entry(i, out)

Final result, after step n-1 (``_agent.final_result``)::

    outputs = [e["name"] for e in transcript]                 # "grow": read back from state
    outputs = [f"out-{k}" for k in range(n)]                  # "const", "mutate": checked on arrival
    # ("mutate" also checks each slot holds the message of the last step that wrote it)
    {"n": n, "digest": sha256("|".join(outputs).encode()).hexdigest()[:16]}
    # and {"n": state["i"], "digest": "MISMATCH"} if ok is False / the count is wrong

so every correct run returns ``_agent.expected_result(n)``; e.g. n=10 -> digest of
"out-0|out-1|...|out-9". (In "const" the state stays constant-size, so the digest cannot be
recomputed from stored outputs; the per-step check against ``fake_llm(i)`` and the counter
stand in for them.)

Crash and measurement points (same for every peer and for tcc):

- **crash**: the process SIGKILLs itself at the START of step n-1 (first statement of the
  step body), so steps 0..n-2 are durable and step n-1 has not run.
- **first new step**: in the recovery process, the moment step n-1's body starts executing
  (``time.time()``), i.e. after the peer served/restored steps 0..n-2.
- **whole-process recovery**: parent ``time.time()`` just before spawning the recovery
  process -> first new step. Includes interpreter start-up and imports (reported apart).
- **in-process recovery**: in the recovery process, just before opening the peer's store
  (DBOS: before ``DBOS(config)`` + ``DBOS.launch()``; LangGraph: before
  ``sqlite3.connect`` + ``SqliteSaver`` + ``compile``) -> first new step.
- **per-step overhead**: in the crash run, (time from agent start to the start of step n-1)
  / (n-1), minus the bare loop's per-step time (same agent with no framework,
  ``_agent.bare_per_step_s``).
- **storage bytes**: the SQLite file (+ WAL / journal) after all n steps completed.

API
===

Each peer module (``dbos_peer``, ``langgraph_peer``) has ``available() -> bool`` and
``measure(n, *, regime="const", work_ms=0.0, repeats=3, workdir, work_iters=None) -> dict``,
running every peer operation in child processes (``sys.executable``). The dict holds
``peer, version, n, regime, work_ms, work_iters, repeats, whole_process_s`` (list, one per
repeat), ``in_process_s`` (list), their medians, ``breakdown_s`` (per-phase lists),
``per_step_overhead_s``, ``bare_step_s``, ``storage_bytes``, ``storage_bytes_at_crash``,
``final_result``, ``effect_executions`` / ``duplicate_effects`` (over crash + recovery +
completion), ``fsync_4k_median_s`` (a contention gauge taken at the start), ``python`` and
``notes``.

``langgraph_peer.measure`` also takes ``delta=True``: the peer "langgraph delta" (listed in
``langgraph_peer.VARIANTS``, which ``benchmarks.recovery.step_costs`` runs), whose transcript
("grow") or scratchpad ("mutate") is a ``DeltaChannel`` (beta): checkpoints store each step's
write and a whole snapshot every ``snapshot_frequency`` writes, not the whole value each time.

Each peer module (and ``tcc_peer``, and each entry of ``VARIANTS``) also has
``measure_steps(n, *, marks, regime="const", workdir) -> {m: seconds}``: one crash child only
(``_harness.step_run``), giving the mean step of the first m-1 steps for each size m in
``marks`` and for n (what ``benchmarks.recovery.step_costs`` times).
"""

from __future__ import annotations

from ._agent import busy_work as busy_work
from ._agent import calibrate_work as calibrate_work
from ._agent import expected_digest as expected_digest
from ._agent import expected_result as expected_result
from ._agent import fake_llm as fake_llm
from ._agent import final_result as final_result
from ._agent import transcript_entry as transcript_entry

PEERS = ("dbos", "langgraph")

__all__ = [
    "PEERS",
    "busy_work",
    "calibrate_work",
    "expected_digest",
    "expected_result",
    "fake_llm",
    "final_result",
    "transcript_entry",
]
