"""Python's allocations traced in every process of a soak's server (`scripts/soak.py --trace-every-minutes`).

On the server's PYTHONPATH only for such a run: each Python process (the API server, vLLM's engine core and
worker, forked or spawned) starts `tracemalloc` LORAPLEX_SOAK_TRACE_EVERY_S seconds after it starts (tracing
imports and the engine's compile would take many minutes), then writes a snapshot to LORAPLEX_SOAK_TRACE_DIR every
as many seconds, from a thread of its own (the Python API, so no lock is taken from outside). A snapshot holds what
was allocated since tracing started and is still alive: growth between two of them is what the run kept.
"""

from __future__ import annotations

import json
import os
import threading
import time
import tracemalloc
from pathlib import Path

FRAMES = 10


def _write(folder: Path, started: float) -> None:
    pid = os.getpid()
    name = Path("/proc/self/comm").read_text().strip().replace("/", "_").replace(":", "_")
    stamp = int(time.monotonic() - started)
    tracemalloc.take_snapshot().dump(str(folder / f"{name}-{pid}-{stamp:06d}.snap"))
    current, peak = tracemalloc.get_traced_memory()
    rss_kib = next(int(line.split()[1]) for line in Path("/proc/self/status").read_text().splitlines()
                   if line.startswith("VmRSS:"))
    with (folder / "traced.jsonl").open("a") as out:
        out.write(json.dumps({"process": name, "pid": pid, "t_s": stamp, "traced_mib": current / 2**20,
                              "rss_mib": rss_kib / 1024}) + "\n")


def _loop(folder: Path, every_s: float) -> None:
    started = time.monotonic()
    time.sleep(every_s)
    if not tracemalloc.is_tracing():
        tracemalloc.start(FRAMES)
    while True:
        time.sleep(every_s)
        try:
            _write(folder, started)
        except Exception:  # a diagnostic: never take the process down
            pass


def _start() -> None:
    threading.Thread(target=_loop, args=(Path(os.environ["LORAPLEX_SOAK_TRACE_DIR"]),
                                          float(os.environ.get("LORAPLEX_SOAK_TRACE_EVERY_S", "600"))),
                     name="soak-tracemalloc", daemon=True).start()


if os.environ.get("LORAPLEX_SOAK_TRACE_DIR"):
    _start()
    os.register_at_fork(after_in_child=_start)  # a forked child has no thread but this one
