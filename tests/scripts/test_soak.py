"""The soak script's plumbing: the server's environment for tracing, the allocator reports it records, and what the
summary counts."""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import soak  # noqa: E402


@pytest.fixture
def results_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(soak, "RESULTS", tmp_path)
    return tmp_path


@pytest.mark.parametrize(("trace", "heap", "names"), [
    (None, None, set()),
    (8, None, {"PYTHONPATH", "LORAPLEX_SOAK_TRACE_DIR", "LORAPLEX_SOAK_TRACE_EVERY_S"}),
    (None, 4, {"PYTHONPATH", "LD_PRELOAD", "LORAPLEX_SOAK_HEAP_DIR", "LORAPLEX_SOAK_HEAP_EVERY_S"}),
    (8, 4, {"PYTHONPATH", "LD_PRELOAD", "LORAPLEX_SOAK_TRACE_DIR", "LORAPLEX_SOAK_TRACE_EVERY_S",
            "LORAPLEX_SOAK_HEAP_DIR", "LORAPLEX_SOAK_HEAP_EVERY_S"}),
])
def test_trace_env(results_dir, monkeypatch, trace, heap, names):
    monkeypatch.setattr(soak.ctypes.util, "find_library", lambda name: "libtcmalloc.so.4")
    env = soak.trace_env(trace, heap)
    assert set(env) == names
    if heap is not None:
        assert env["LD_PRELOAD"] == "libtcmalloc.so.4" and env["LORAPLEX_SOAK_HEAP_EVERY_S"] == str(heap * 60)
    if names:
        assert env["PYTHONPATH"].split(":")[0].endswith("scripts/soak_trace")
        assert (results_dir / ".soak-trace").is_dir()


def test_allocators_env_names_its_folder_and_period(results_dir):
    env = soak.trace_env(None, None, allocators_every_minutes=2.5)
    assert set(env) == {"PYTHONPATH", "LORAPLEX_SOAK_ALLOC_DIR", "LORAPLEX_SOAK_ALLOC_EVERY_S"}
    assert env["LORAPLEX_SOAK_ALLOC_EVERY_S"] == "150.0"


def _soak_site():
    spec = importlib.util.spec_from_file_location("soak_site", Path(soak.__file__).parent / "soak_trace"
                                                  / "sitecustomize.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # starts nothing: no LORAPLEX_SOAK_* variable is set here
    return module


def test_pymalloc_totals_are_read_from_cpythons_own_report(tmp_path):
    soak_site = _soak_site()
    before = soak_site._pymalloc_totals(tmp_path / "report.txt")
    kept = [object() for _ in range(500_000)]  # 8 MB of 16-byte blocks: new arenas
    after = soak_site._pymalloc_totals(tmp_path / "report.txt")
    # Other threads of the test process allocate and free meanwhile: half the blocks' bytes is a margin they
    # cannot fill.
    assert after["arenas"] - before["arenas"] >= 4
    assert after["live_bytes"] - before["live_bytes"] >= 8 * len(kept)


def test_glibc_arenas_show_blocks_in_use_and_blocks_freed(tmp_path):
    soak_site = _soak_site()
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]

    def totals() -> tuple[int, int]:
        arenas = soak_site._glibc_arenas(tmp_path / "info.xml")
        return (sum(a["system_bytes"] - a["free_bytes"] for a in arenas), sum(a["free_bytes"] for a in arenas))

    in_use_before, _ = totals()
    blocks = [libc.malloc(64 * 1024) for _ in range(256)]  # 16 MiB of blocks below the mmap threshold: in an arena
    in_use_held, free_held = totals()
    for block in blocks[:-1]:  # the last one keeps the others from being trimmed off the top
        libc.free(block)
    _, free_after = totals()
    libc.free(blocks[-1])
    # Other threads of the test process allocate and free meanwhile: half the blocks' bytes is a margin they
    # cannot fill.
    assert in_use_held - in_use_before >= 128 * 64 * 1024
    assert free_after - free_held >= 128 * 64 * 1024


def test_trace_only_names_the_processes_to_trace(results_dir):
    env = soak.trace_env(8, None, ["VLLM::EngineCor", "python"])
    assert env["LORAPLEX_SOAK_TRACE_ONLY"] == "VLLM::EngineCor,python"
    assert "LORAPLEX_SOAK_TRACE_ONLY" not in soak.trace_env(8, None)


def test_a_heap_profile_without_gperftools_says_what_to_install(results_dir, monkeypatch):
    monkeypatch.setattr(soak.ctypes.util, "find_library", lambda name: None)
    with pytest.raises(SystemExit, match="libgoogle-perftools4"):
        soak.trace_env(None, 4)


def test_requests_without_an_answer_are_counted_by_error_and_by_ledger_row():
    results = [soak.Result("a", 0.0, 200, ttft_s=0.01, e2e_s=0.1),
               soak.Result("b", 0.0, 0, e2e_s=0.1, error="RemoteProtocolError"),
               soak.Result("c", 0.0, 0, e2e_s=0.1, error="RemoteProtocolError"),
               soak.Result("d", 0.0, 0, e2e_s=0.1, error="ConnectError")]
    samples = [soak.Sample(10.0, 100.0, 20, 4, 100.0, 100.0, 10.0)]
    args = argparse.Namespace(minutes=1, window_minutes=1)
    summary = soak.summarize("soak", args, 10.0, 6.0, results, samples, billed={"a", "b"})
    assert summary["statuses"] == {"200": 1, "0": 3}
    assert summary["client_errors"] == {"RemoteProtocolError": 2, "ConnectError": 1}
    assert summary["unanswered_with_ledger_row"] == 1
    assert summary["answered_without_ledger_row"] == 0
