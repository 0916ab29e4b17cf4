"""The engine processes' periodic malloc_trim: its setting, its loop, and that glibc's call gives memory back."""

from __future__ import annotations

import ctypes
import multiprocessing

import pytest

from engine.worker import malloc_trim


@pytest.mark.parametrize(("value", "expected"), [
    (None, malloc_trim.DEFAULT_PERIOD_S),
    ("", malloc_trim.DEFAULT_PERIOD_S),
    ("30", 30.0),
    (" 0.5 ", 0.5),
    ("0", None),
])
def test_period_from_the_environment(value, expected):
    environ = {} if value is None else {malloc_trim.ENV_PERIOD: value}
    assert malloc_trim.period_s(environ) == expected


@pytest.mark.parametrize("value", ["-1", "soon", "nan", "inf"])
def test_a_bad_period_is_refused_by_name(value):
    with pytest.raises(ValueError, match=malloc_trim.ENV_PERIOD):
        malloc_trim.period_s({malloc_trim.ENV_PERIOD: value})


def test_the_loop_trims_everything_each_period():
    calls = []
    malloc_trim.run(calls.append, period=0.0, rounds=3)
    assert calls == [0, 0, 0]


def test_the_server_process_itself_is_left_alone(monkeypatch):
    monkeypatch.setattr(malloc_trim, "glibc_malloc_trim", lambda: pytest.fail("looked up in the server process"))
    malloc_trim.start({malloc_trim.ENV_PERIOD: "1"})


def _resident_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def _freed_space_returned(queue) -> None:
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    # 64 MiB in 64 KiB blocks (below glibc's mmap threshold, so from the heap), then every block but the last
    # freed: the freed space lies below a live block, where glibc's own trimming of the heap's top cannot reach it.
    blocks = [libc.malloc(65536) for _ in range(1024)]
    for b in blocks:
        ctypes.memset(b, 1, 65536)
    for b in blocks[:-1]:
        libc.free(b)
    before = _resident_mib()
    malloc_trim.glibc_malloc_trim()(0)
    queue.put((before, _resident_mib()))


def test_glibc_trim_returns_freed_space_below_a_live_block():
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=_freed_space_returned, args=(queue,))
    child.start()
    before, after = queue.get(timeout=60)
    child.join(timeout=60)
    assert before - after > 48, (before, after)
