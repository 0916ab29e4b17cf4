"""vLLM's engine processes give the memory they free back to the system, every minute.

A heap profile over a soak (docs/reliability.md, 2026-12-07) showed the worker's live native memory flat while its
RSS kept growing: freed blocks stay in glibc's arenas, which return to the system only the free space at the top of
a heap. In every process vLLM starts, a daemon thread calls glibc's `malloc_trim(0)` every `LORAPLEX_MALLOC_TRIM_S`
seconds (default 60; 0 turns it off), which releases every whole free page of every arena: side by side at 0.6 x
capacity, the worker held 31 MiB less and grew a third slower (it still grows). Each call holds one arena's lock at
a time; its duration is logged whenever it is the longest so far (at most 10.9 ms in that run).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Mapping

from vllm.logger import init_logger

logger = init_logger(f"vllm.loraplex.{__name__}")

ENV_PERIOD = "LORAPLEX_MALLOC_TRIM_S"
DEFAULT_PERIOD_S = 60.0
_started = False


def period_s(environ: Mapping[str, str]) -> float | None:
    """Seconds between trims, None when turned off. Raises ValueError naming the variable for a bad value."""
    text = environ.get(ENV_PERIOD, "").strip()
    if not text:
        return DEFAULT_PERIOD_S
    try:
        value = float(text)
    except ValueError as e:
        raise ValueError(f"{ENV_PERIOD} must be a number of seconds (0: off), got {text!r}") from e
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{ENV_PERIOD} must be a number of seconds (0: off), got {text!r}")
    return value or None


def glibc_malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None where the C library has none (musl)."""
    name = ctypes.util.find_library("c")
    trim = getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    if trim is not None:
        trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def start(environ: Mapping[str, str] = os.environ) -> None:
    """In a child process (vLLM's engine core, its workers): trim periodically. Idempotent; does nothing in the
    server process itself."""
    global _started
    if _started or multiprocessing.parent_process() is None:
        return
    period = period_s(environ)
    if period is None:
        return
    trim = glibc_malloc_trim()
    if trim is None:
        return
    _started = True
    threading.Thread(target=run, args=(trim, period), name="loraplex-malloc-trim", daemon=True).start()


def run(trim: Callable[[int], int], period: float, rounds: int | None = None) -> None:
    """Calls `trim(0)` every `period` seconds, `rounds` times (None: for ever)."""
    longest = 0.0
    done = 0
    while rounds is None or done < rounds:
        time.sleep(period)
        began = time.perf_counter()
        trim(0)
        took = time.perf_counter() - began
        done += 1
        if took > longest:
            longest = took
            logger.info("loraplex: malloc_trim took %.1f ms, the longest so far in pid %d", took * 1e3, os.getpid())
