"""Allocations traced in every process of a soak's server: Python's (`scripts/soak.py --trace-every-minutes`) or
native ones (`--heap-profile-every-minutes`).

On the server's PYTHONPATH only for such a run: each Python process (the API server, vLLM's engine core and
worker, forked or spawned; or only those LORAPLEX_SOAK_TRACE_ONLY names, by /proc/PID/comm) starts `tracemalloc`
LORAPLEX_SOAK_TRACE_EVERY_S seconds after it starts (tracing imports and the engine's compile would take many
minutes), then writes a snapshot to LORAPLEX_SOAK_TRACE_DIR every as many seconds, from a thread of its own (the
Python API, so no lock is taken from outside). A snapshot holds what was allocated since tracing started and is
still alive: growth between two of them is what the run kept.

Native: the server runs with gperftools' TCMalloc preloaded (Debian's libgoogle-perftools4), and each process that
maps it starts TCMalloc's heap profiler LORAPLEX_SOAK_HEAP_EVERY_S seconds after it starts, then dumps a profile to
LORAPLEX_SOAK_HEAP_DIR every as many seconds and appends the bytes malloc holds for the program to heap.jsonl. Two
profiles compare with `google-pprof --text --base=EARLIER python3 LATER` (package google-perftools).

The allocators' own view (`--allocators-every-minutes`): every LORAPLEX_SOAK_ALLOC_EVERY_S seconds each process
appends to LORAPLEX_SOAK_ALLOC_DIR/allocators.jsonl its pymalloc totals (arenas mapped, bytes in live blocks, bytes
free inside them) and glibc's per arena (`malloc_info`: bytes the arena has from the system, bytes free in its bins).
pymalloc maps its 1 MiB arenas itself, and glibc's arenas hold native allocations and the free chunks they keep;
tracemalloc's live bytes show none of these.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import threading
import time
import tracemalloc
from pathlib import Path

FRAMES = 10


def _comm() -> str:
    return Path("/proc/self/comm").read_text().strip()


def _process_name() -> str:
    """The process's name as a file name."""
    return _comm().replace("/", "_").replace(":", "_")


def _rss_mib() -> float:
    return next(int(line.split()[1]) for line in Path("/proc/self/status").read_text().splitlines()
                if line.startswith("VmRSS:")) / 1024


def _write(folder: Path, started: float) -> None:
    pid, name = os.getpid(), _process_name()
    stamp = int(time.monotonic() - started)
    tracemalloc.take_snapshot().dump(str(folder / f"{name}-{pid}-{stamp:06d}.snap"))
    current, peak = tracemalloc.get_traced_memory()
    with (folder / "traced.jsonl").open("a") as out:
        out.write(json.dumps({"process": name, "pid": pid, "t_s": stamp, "traced_mib": current / 2**20,
                              "rss_mib": _rss_mib()}) + "\n")


def _loop(folder: Path, every_s: float, only: set[str]) -> None:
    started = time.monotonic()
    time.sleep(every_s)
    if only and _comm() not in only:
        return
    if not tracemalloc.is_tracing():
        tracemalloc.start(FRAMES)
    while True:
        time.sleep(every_s)
        try:
            _write(folder, started)
        except Exception:  # a diagnostic: never take the process down
            pass


def _start() -> None:
    only = set(filter(None, os.environ.get("LORAPLEX_SOAK_TRACE_ONLY", "").split(",")))
    threading.Thread(target=_loop, args=(Path(os.environ["LORAPLEX_SOAK_TRACE_DIR"]),
                                          float(os.environ.get("LORAPLEX_SOAK_TRACE_EVERY_S", "600")), only),
                     name="soak-tracemalloc", daemon=True).start()


def _heap_loop(folder: Path, every_s: float) -> None:
    time.sleep(every_s)
    if "libtcmalloc.so" not in Path("/proc/self/maps").read_text():
        return
    tcmalloc = ctypes.CDLL("libtcmalloc.so.4")
    pid, name, started = os.getpid(), _process_name(), time.monotonic()
    tcmalloc.HeapProfilerStart(str(folder / f"{name}-{pid}").encode())
    allocated = ctypes.c_size_t()
    while True:
        time.sleep(every_s)
        tcmalloc.HeapProfilerDump(b"soak")
        tcmalloc.MallocExtension_GetNumericProperty(b"generic.current_allocated_bytes", ctypes.byref(allocated))
        with (folder / "heap.jsonl").open("a") as out:
            out.write(json.dumps({"process": name, "pid": pid, "t_s": int(time.monotonic() - started),
                                  "allocated_mib": allocated.value / 2**20, "rss_mib": _rss_mib()}) + "\n")


def _start_heap() -> None:
    threading.Thread(target=_heap_loop, args=(Path(os.environ["LORAPLEX_SOAK_HEAP_DIR"]),
                                               float(os.environ.get("LORAPLEX_SOAK_HEAP_EVERY_S", "600"))),
                     name="soak-heap-profile", daemon=True).start()


PYMALLOC_LINES = {"arenas": r"# arenas allocated current\s*=\s*([\d,]+)",
                  "live_bytes": r"# bytes in allocated blocks\s*=\s*([\d,]+)",
                  "free_bytes_in_pools": r"# bytes in available blocks\s*=\s*([\d,]+)",
                  "unused_pool_bytes": r"unused pools \* \d+ bytes\s*=\s*([\d,]+)"}


def _c_report(scratch: Path, write) -> str:
    """What `write(FILE *)` prints, through a C stream on `scratch` (not stderr)."""
    libc = ctypes.CDLL(None)
    libc.fopen.restype = ctypes.c_void_p
    stream = libc.fopen(str(scratch).encode(), b"w")
    try:
        write(ctypes.c_void_p(stream))
    finally:
        libc.fclose(ctypes.c_void_p(stream))
    return scratch.read_text()


def _pymalloc_totals(scratch: Path) -> dict[str, int]:
    """CPython's own report (`sys._debugmallocstats`)."""
    report = _c_report(scratch, ctypes.pythonapi._PyObject_DebugMallocStats)
    return {key: int(re.search(pattern, report).group(1).replace(",", "")) for key, pattern in PYMALLOC_LINES.items()}


def _glibc_arenas(scratch: Path) -> list[dict[str, int]]:
    """glibc's `malloc_info` per arena: from the system (`system current`), free in its bins (fast and the rest).
    The arena's top chunk is in neither bin, so what is free at the top counts as not free here."""
    report = _c_report(scratch, lambda stream: ctypes.CDLL(None).malloc_info(0, stream))
    arenas = []
    for number, body in re.findall(r'<heap nr="(\d+)">(.*?)</heap>', report, re.S):
        free = sum(int(size) for size in re.findall(r'<total type="(?:fast|rest)" count="\d+" size="(\d+)"/>', body))
        system = int(re.search(r'<system type="current" size="(\d+)"/>', body).group(1))
        arenas.append({"arena": int(number), "system_bytes": system, "free_bytes": free})
    return arenas


def _allocators_loop(folder: Path, every_s: float) -> None:
    pid, started = os.getpid(), time.monotonic()
    while True:
        time.sleep(every_s)
        try:
            name = _process_name()  # vLLM names its processes after they start
            scratch = folder / f".{name}-{pid}.txt"
            record = {"process": name, "pid": pid, "t_s": int(time.monotonic() - started), "rss_mib": _rss_mib(),
                      "pymalloc": _pymalloc_totals(scratch), "glibc": _glibc_arenas(scratch)}
            with (folder / "allocators.jsonl").open("a") as out:
                out.write(json.dumps(record) + "\n")
        except Exception:  # a diagnostic: never take the process down
            pass


def _start_allocators() -> None:
    threading.Thread(target=_allocators_loop, args=(Path(os.environ["LORAPLEX_SOAK_ALLOC_DIR"]),
                                                     float(os.environ.get("LORAPLEX_SOAK_ALLOC_EVERY_S", "600"))),
                     name="soak-allocators", daemon=True).start()


if os.environ.get("LORAPLEX_SOAK_ALLOC_DIR"):
    _start_allocators()
    os.register_at_fork(after_in_child=_start_allocators)
if os.environ.get("LORAPLEX_SOAK_HEAP_DIR"):
    _start_heap()
if os.environ.get("LORAPLEX_SOAK_TRACE_DIR"):
    _start()
    os.register_at_fork(after_in_child=_start)  # a forked child has no thread but this one
