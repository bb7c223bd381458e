"""A DBOS worker process of the fleet benchmark (``benchmarks.fleet``): the twin of a
``tcc worker``.

Usage: python fleet_child_dbos.py '<json args>' with keys url (postgresql:// URL of the
system database), executor (its executor id), concurrency (the queue's worker_concurrency
in this process), ready (a file written once the queue is registered and polled).

``DBOS(config)`` + ``DBOS.launch()``, then ``DBOS.register_queue("fleet",
worker_concurrency=...)`` with DBOS's defaults otherwise (a 1 s queue poll, LISTEN/NOTIFY
on); the workflow ``fleet_workflow`` runs ``fleet_agent.py``'s steps as ``@DBOS.step``s.
Then it idles until SIGTERM (``DBOS.destroy()``) or SIGKILL.
"""

import json
import os
import signal
import sys
import threading
import time

from dbos import DBOS

ARGS = json.loads(sys.argv[1])
QUEUE = "fleet"


@DBOS.step()
def fleet_step(log: str, tag: str, i: int) -> int:
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, f"{tag} {i} {time.time():.6f} {os.getpid()}\n".encode())
    finally:
        os.close(fd)
    return i


@DBOS.workflow(name="fleet_workflow")
def fleet_workflow(log: str, tag: str, steps: int, delay: float = 0.0) -> dict:
    total = 0
    for i in range(int(steps)):
        total += fleet_step(log, tag, i)
        if delay:
            time.sleep(delay)
    return {"tag": tag, "steps": int(steps), "total": total}


def main() -> None:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    config = {"name": "tcc-bench-fleet", "system_database_url": ARGS["url"], "log_level": "ERROR",
              "executor_id": ARGS["executor"]}
    DBOS(config=config)
    DBOS.launch()
    DBOS.register_queue(QUEUE, worker_concurrency=int(ARGS["concurrency"]))
    with open(ARGS["ready"] + ".tmp", "w") as f:
        f.write(repr(time.time()))
    os.replace(ARGS["ready"] + ".tmp", ARGS["ready"])
    while not stop.wait(0.5):
        pass
    DBOS.destroy(workflow_completion_timeout_sec=0)
    os._exit(0)


if __name__ == "__main__":
    main()
