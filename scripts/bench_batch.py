"""Scenario `batch`: what a running batch costs live traffic, and what a batch gets from an idle engine.

One loraplex server (the tiny demo, 32 engine sequences, no tenants file). Two parts:

1. Live TTFT with and without a running batch, interleaved: rounds of [live alone, live beside a batch]. Live
   traffic is an open loop of streamed completions at a fixed rate (32 output tokens, the three demo adapters
   and the base model in turn); a request's TTFT is to its first streamed chunk. In the `with batch` phase a
   batch of far more lines than the phase can finish (32 output tokens each) holds every engine slot before
   the first live request; it is cancelled, and its cancel awaited, after the phase. Reported: live TTFT p50/p95/p99 of
   each condition over all rounds, the same without each phase's first request (beside a batch, the one that
   preempts it and waits for the batch step in flight) with those first requests' TTFTs, and the batch lines
   finished and preempted while live traffic ran.
2. Idle throughput: the same prompts (64 output tokens each, `ignore_eos`) sent live with concurrency 32 (the
   batch runner's default `batch_max_running_lines`) and as one batch, interleaved over rounds, each started on a
   server idle for `admission.batch_quiet_s` (2 s: batch lines wait that long after live traffic). Batch time runs
   from `POST /v1/batches` to the status `completed` (polled every 50 ms), so it includes validation, the
   writes of line results and the output file.
"""

from __future__ import annotations

import asyncio
import io
import json
import re
import tempfile
import time
from pathlib import Path

import httpx
from bench_servers import (
    bounded,
    demo_assets,
    free_port,
    loraplex_command,
    own_state,
    percentile_ms,
    running,
    say,
    stream_ttft,
)

from adapters.base_model import base_model_spec

LIVE_RATE_PER_S, LIVE_TOKENS, BATCH_TOKENS = 2.0, 32, 64
ENGINE_BATCH = 32
POLL_S = 0.05
QUIET_S = 2.0  # admission.batch_quiet_s's default


def _lines(model_ids: list[str], count: int, max_tokens: int, tag: str) -> bytes:
    rows = [{"custom_id": f"{tag}-{i}", "method": "POST", "url": "/v1/completions",
             "body": {"model": model_ids[i % len(model_ids)], "prompt": f"batch prompt number {i} about rivers",
                      "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0}} for i in range(count)]
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


async def _create_batch(client: httpx.AsyncClient, content: bytes) -> str:
    uploaded = await client.post("/v1/files", data={"purpose": "batch"},
                                 files={"file": ("in.jsonl", io.BytesIO(content), "application/jsonl")})
    uploaded.raise_for_status()
    created = await client.post("/v1/batches", json={"input_file_id": uploaded.json()["id"],
                                                     "endpoint": "/v1/completions", "completion_window": "24h"})
    created.raise_for_status()
    return created.json()["id"]


async def _wait(client: httpx.AsyncClient, batch_id: str, statuses: tuple[str, ...]) -> dict:
    while (batch := (await client.get(f"/v1/batches/{batch_id}")).json())["status"] not in statuses:
        await asyncio.sleep(POLL_S)
    return batch


async def _metric(client: httpx.AsyncClient, name: str) -> float:
    found = re.search(rf"^{name} (\S+)$", (await client.get("/metrics")).text, re.M)
    return float(found.group(1)) if found else 0.0


async def _live_phase(client: httpx.AsyncClient, models: list[str], count: int) -> list[float]:
    """`count` streamed requests arriving every 1/rate s, whatever is in flight; their TTFTs."""
    async def one(i: int) -> float:
        await asyncio.sleep(i / LIVE_RATE_PER_S)
        ttft, _ = await stream_ttft(client, {"model": models[i % len(models)], "prompt": f"live question {i}",
                                             "max_tokens": LIVE_TOKENS, "ignore_eos": True, "temperature": 0})
        return ttft

    return list(await asyncio.gather(*[one(i) for i in range(count)]))


async def _ttft_part(client: httpx.AsyncClient, models: list[str], rounds: int, per_phase: int) -> dict:
    alone: list[float] = []
    beside: list[float] = []  # phase after phase, each in arrival order
    lines_done, preempted = 0, 0.0
    for r in range(rounds):
        alone += await _live_phase(client, models, per_phase)
        batch_id = await _create_batch(client, _lines(models, 4000, LIVE_TOKENS, f"bg{r}"))
        await _wait(client, batch_id, ("in_progress",))
        while await _metric(client, "loraplex_batch_running_lines") < ENGINE_BATCH:  # lines in the engine
            await asyncio.sleep(POLL_S)
        before = (await client.get(f"/v1/batches/{batch_id}")).json()["request_counts"]["completed"]
        preempted_before = await _metric(client, "loraplex_batch_preemptions_total")
        beside += await _live_phase(client, models, per_phase)
        after = (await client.get(f"/v1/batches/{batch_id}")).json()["request_counts"]["completed"]
        preempted += await _metric(client, "loraplex_batch_preemptions_total") - preempted_before
        lines_done += after - before
        await client.post(f"/v1/batches/{batch_id}/cancel")
        await _wait(client, batch_id, ("cancelled", "completed"))
        say(f"batch: round {r + 1}/{rounds}: TTFT p95 alone {percentile_ms(alone, 95):.0f} ms, beside a batch "
            f"{percentile_ms(beside, 95):.0f} ms")

    def stats(values: list[float]) -> dict:
        return {"requests": len(values), **{f"ttft_p{q}_ms": percentile_ms(values, q) for q in (50, 95, 99)}}

    def after_first(values: list[float]) -> list[float]:
        """Without each phase's first request: beside a batch, the one that preempts it."""
        return [v for i, v in enumerate(values) if i % per_phase]

    return {"alone": stats(alone), "with_batch": stats(beside), "batch_lines_done_during_live": lines_done,
            "batch_preemptions_during_live": preempted,
            "p95_with_vs_alone": percentile_ms(beside, 95) / percentile_ms(alone, 95),
            "alone_after_first": stats(after_first(alone)), "with_batch_after_first": stats(after_first(beside)),
            "first_of_phase_with_batch_ms": [round(v * 1000, 1) for v in beside[::per_phase]],
            "first_of_phase_alone_ms": [round(v * 1000, 1) for v in alone[::per_phase]]}


async def _throughput_part(client: httpx.AsyncClient, models: list[str], rounds: int, prompts: int) -> dict:
    live_s, batch_s = [], []
    for r in range(rounds):
        await asyncio.sleep(QUIET_S)  # both start on an idle server: batch lines wait this long after live traffic
        content = _lines(models, prompts, BATCH_TOKENS, f"tp{r}")
        bodies = [json.loads(line)["body"] for line in content.decode().splitlines()]
        started = time.perf_counter()

        async def send(body: dict) -> int:
            response = await client.post("/v1/completions", json=body)
            response.raise_for_status()
            return response.json()["usage"]["completion_tokens"]

        tokens = await bounded(ENGINE_BATCH, [lambda b=b: send(b) for b in bodies])
        live_s.append(time.perf_counter() - started)
        assert sum(tokens) == prompts * BATCH_TOKENS
        await asyncio.sleep(QUIET_S)
        started = time.perf_counter()
        batch_id = await _create_batch(client, content)
        done = await _wait(client, batch_id, ("completed", "failed", "cancelled", "expired"))
        batch_s.append(time.perf_counter() - started)
        if done["request_counts"]["completed"] != prompts:
            raise RuntimeError(f"batch {batch_id} ended {done['status']} with {done['request_counts']}")
        say(f"batch: throughput round {r + 1}/{rounds}: live {live_s[-1]:.1f} s, batch {batch_s[-1]:.1f} s")
    tokens = prompts * BATCH_TOKENS
    live_tok_s = [tokens / s for s in live_s]
    batch_tok_s = [tokens / s for s in batch_s]
    return {"prompts": prompts, "output_tokens_each": BATCH_TOKENS, "live_tok_s": live_tok_s,
            "batch_tok_s": batch_tok_s, "live_tok_s_mean": sum(live_tok_s) / rounds,
            "batch_tok_s_mean": sum(batch_tok_s) / rounds,
            "batch_vs_live": (sum(batch_tok_s) / rounds) / (sum(live_tok_s) / rounds)}


def run(out_dir: Path, quick: bool) -> dict:
    demo = demo_assets()
    rounds, per_phase, prompts = (2, 16, 64) if quick else (4, 40, 192)
    models = [base_model_spec(demo.model_dir).model_id, *demo.adapter_dirs]
    with tempfile.TemporaryDirectory(prefix="loraplex-bench-batch-") as state:
        port = free_port()
        cmd = loraplex_command(port, dict(demo.adapter_dirs), 4, 8, demo.model_dir, extra=(
            "--max-num-seqs", str(ENGINE_BATCH), *own_state(state), "--batch-store-path", f"{state}/batches.sqlite",
            "--files-store-uri", f"{state}/files"))
        say("batch: server")
        with running(cmd, port, out_dir / ".batch.log") as base:
            async def drive() -> dict:
                async with httpx.AsyncClient(base_url=base, timeout=600,
                                             limits=httpx.Limits(max_connections=ENGINE_BATCH + 8)) as client:
                    await _live_phase(client, models, 4)  # warm-up: each adapter loaded
                    return {"ttft": await _ttft_part(client, models, rounds, per_phase),
                            "throughput": await _throughput_part(client, models, rounds, prompts)}

            results = asyncio.run(drive())
    return {"engine_batch": ENGINE_BATCH, "live_rate_per_s": LIVE_RATE_PER_S, "live_tokens": LIVE_TOKENS,
            "rounds": rounds, "live_per_phase": per_phase, **results}


def _ms(value: float | None):
    return "-" if value is None else round(value)


def tables(results: dict):
    t = results["ttft"]
    conditions = [("live alone", "alone"), ("live beside a running batch", "with_batch"),
                  ("live alone, each phase's first request left out", "alone_after_first"),
                  ("beside a batch, the request that preempts it left out", "with_batch_after_first")]
    ttft_rows = [[name, t[key]["requests"], *(_ms(t[key][f"ttft_p{q}_ms"]) for q in (50, 95, 99))]
                 for name, key in conditions if key in t]
    tp = results["throughput"]
    return [
        (f"Live TTFT, {results['live_rate_per_s']:g} requests/s of {results['live_tokens']} tokens, "
         f"{results['rounds']} interleaved rounds (p95 beside a batch / alone: {t['p95_with_vs_alone']:.2f}; "
         f"batch lines finished meanwhile: {t['batch_lines_done_during_live']}, preempted: "
         f"{t['batch_preemptions_during_live']:.0f})",
         ["condition", "requests", "TTFT p50 ms", "TTFT p95 ms", "TTFT p99 ms"], ttft_rows),
        (f"Idle engine: {tp['prompts']} prompts of {tp['output_tokens_each']} output tokens (batch / live: "
         f"{tp['batch_vs_live']:.2f})",
         ["sent as", "output tok/s (mean)", "per round"],
         [["live, concurrency 32", round(tp["live_tok_s_mean"]), ", ".join(str(round(x)) for x in tp["live_tok_s"])],
          ["one batch", round(tp["batch_tok_s_mean"]), ", ".join(str(round(x)) for x in tp["batch_tok_s"])]]),
    ]
