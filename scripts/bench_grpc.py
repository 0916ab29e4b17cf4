"""Scenario `grpc`: gRPC streaming (the Open Inference Protocol's ModelStreamInfer) against HTTP SSE
(`/v1/completions`), on one loraplex server serving both, the same load interleaved in several rounds.

Each request streams MAX_TOKENS tokens (`ignore_eos`) from a short prompt, round-robin over the base model and the
demo adapters, at each concurrency. Both fronts run through the same pipeline; what differs is the wire (HTTP/1.1
SSE text vs gRPC protobuf on HTTP/2) and its per-chunk work in the API process. Kept per run: output tok/s, TTFT
p50/p99 (to the first chunk), and the API process's CPU time per output token (not its engine processes')."""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from pathlib import Path

import grpc
import httpx
from bench_servers import BenchModel, bounded, cpu_seconds, free_port, loraplex_command, percentile_ms, running_process, say

from api.grpc import inference_pb2 as pb
from api.grpc.inference_pb2_grpc import GRPCInferenceServiceStub

MAX_TOKENS = 32
CONCURRENCY = (1, 8, 32)
FRONTS = ("http", "grpc")


def _grpc_request(model: str, index: int) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model)
    sampling = json.dumps({"max_tokens": MAX_TOKENS, "ignore_eos": True, "temperature": 0}).encode()
    for name, datatype, value in [("text_input", "BYTES", f"request {index}: tell a story".encode()),
                                  ("sampling_parameters", "BYTES", sampling), ("stream", "BOOL", True),
                                  ("exclude_input_in_output", "BOOL", True)]:
        tensor = request.inputs.add(name=name, datatype=datatype, shape=[1])
        if datatype == "BOOL":
            tensor.contents.bool_contents.append(value)
        else:
            tensor.contents.bytes_contents.append(value)
    return request


async def _grpc_stream(stub: GRPCInferenceServiceStub, model: str, index: int) -> float:
    started, first = time.perf_counter(), None
    async for response in stub.ModelStreamInfer(iter([_grpc_request(model, index)])):
        if response.error_message:
            raise RuntimeError(response.error_message)
        first = first if first is not None else time.perf_counter() - started
    return first if first is not None else time.perf_counter() - started


async def _http_stream(client: httpx.AsyncClient, model: str, index: int) -> float:
    body = {"model": model, "prompt": f"request {index}: tell a story", "max_tokens": MAX_TOKENS,
            "ignore_eos": True, "temperature": 0, "stream": True}
    started, first = time.perf_counter(), None
    async with client.stream("POST", "/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line.startswith("data: {") and first is None:
                first = time.perf_counter() - started
    return first if first is not None else time.perf_counter() - started


async def _load(front: str, base: str, grpc_address: str, models: list[str], concurrency: int,
                num_prompts: int) -> tuple[list[float], float]:
    """TTFTs (seconds) and wall time of `num_prompts` streams, at most `concurrency` at once."""
    async with httpx.AsyncClient(base_url=base, timeout=600) as client, \
            grpc.aio.insecure_channel(grpc_address) as channel:
        stub = GRPCInferenceServiceStub(channel)
        jobs = [(lambda i=i: _grpc_stream(stub, models[i % len(models)], i)) if front == "grpc"
                else (lambda i=i: _http_stream(client, models[i % len(models)], i)) for i in range(num_prompts)]
        started = time.perf_counter()
        ttfts = await bounded(concurrency, jobs)
        return ttfts, time.perf_counter() - started


def run(out_dir: Path, quick: bool, demo: BenchModel) -> dict:
    adapters = dict(demo.adapter_dirs)
    models = [demo.model_id, *adapters]
    rounds = 1 if quick else 3
    concurrencies = (8,) if quick else CONCURRENCY
    port, grpc_port = free_port(), free_port()
    cmd = loraplex_command(port, adapters, 4, 8, demo.model_dir, extra=("--grpc-port", str(grpc_port)))
    runs: dict[str, dict[int, list[dict]]] = {front: {} for front in FRONTS}
    with running_process(cmd, port, out_dir / ".grpc-loraplex.log") as (base, proc):
        address = f"127.0.0.1:{grpc_port}"
        asyncio.run(_load("grpc", base, address, models, 4, 8))  # warm both fronts and every adapter
        asyncio.run(_load("http", base, address, models, 4, 8))
        for r in range(rounds):
            for c in concurrencies:
                for front in (FRONTS if r % 2 == 0 else FRONTS[::-1]):
                    num_prompts = max(16, 4 * c)
                    cpu_before = cpu_seconds(proc.pid)
                    ttfts, wall = asyncio.run(_load(front, base, address, models, c, num_prompts))
                    tokens = num_prompts * MAX_TOKENS
                    row = {"tok_s": tokens / wall, "ttft_p50_ms": percentile_ms(ttfts, 50),
                           "ttft_p99_ms": percentile_ms(ttfts, 99),
                           "api_cpu_ms_per_token": (cpu_seconds(proc.pid) - cpu_before) * 1000 / tokens}
                    runs[front].setdefault(c, []).append(row)
                    say(f"grpc: round {r + 1}/{rounds} c={c:2d} {front:4s} {row['tok_s']:7.0f} tok/s "
                        f"TTFT p50 {row['ttft_p50_ms']:6.1f} ms, API CPU {row['api_cpu_ms_per_token']:.2f} ms/token")
    summary = []
    for c in concurrencies:
        def mean(front: str, key: str, c: int = c) -> float:
            return statistics.fmean(row[key] for row in runs[front][c])

        summary.append({"concurrency": c, **{f"{front}_{key}": mean(front, key) for front in FRONTS
                                             for key in ("tok_s", "ttft_p50_ms", "ttft_p99_ms",
                                                         "api_cpu_ms_per_token")},
                        "grpc_over_http_per_round": [g["tok_s"] / h["tok_s"] for g, h in
                                                     zip(runs["grpc"][c], runs["http"][c], strict=True)]})
    return {"model": demo.model_id, "models": models, "rounds": rounds, "max_tokens": MAX_TOKENS, "runs": runs,
            "summary": summary}


def table(results: dict):
    headers = ["concurrency", "HTTP SSE tok/s", "gRPC tok/s", "gRPC / HTTP (per round)", "TTFT p50 ms HTTP / gRPC",
               "TTFT p99 ms HTTP / gRPC", "API CPU ms/token HTTP / gRPC"]
    rows = [[s["concurrency"], round(s["http_tok_s"]), round(s["grpc_tok_s"]),
             ", ".join(f"{x:.2f}" for x in s["grpc_over_http_per_round"]),
             f"{s['http_ttft_p50_ms']:.1f} / {s['grpc_ttft_p50_ms']:.1f}",
             f"{s['http_ttft_p99_ms']:.1f} / {s['grpc_ttft_p99_ms']:.1f}",
             f"{s['http_api_cpu_ms_per_token']:.2f} / {s['grpc_api_cpu_ms_per_token']:.2f}"]
            for s in results["summary"]]
    return headers, rows
