"""Scenario `structured`: what structured outputs cost a mixed load, on loraplex and on vLLM's own server.

Each server (same engine arguments, both compiling JSON with xgrammar and no free whitespace) serves, in
interleaved rounds, the same chat load twice: free requests only, and the same with a quarter of the requests
asking for a JSON schema (`response_format`). Requests go round-robin over the base model and the demo
adapters. The tiny model is random, so a constrained answer ends when the grammar does (a few dozen tokens) and
a free one runs to `max_tokens`; tokens/s counts what was generated either way. "JSON parsed" is Python's
strict `json.loads`: xgrammar 0.2.8 lets raw control characters into strings, which strict JSON forbids.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from pathlib import Path

import httpx
from bench_servers import (
    BenchModel,
    bounded,
    free_port,
    loraplex_command,
    percentile_ms,
    running,
    say,
    sse_chunks,
    vllm_command,
)

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["answer", "score", "tags"],
          "properties": {"answer": {"enum": ["yes", "no", "maybe"]},
                         "score": {"type": "integer", "minimum": 0, "maximum": 9},
                         "tags": {"type": "array", "maxItems": 3, "items": {"type": "string", "maxLength": 6}}}}
CONCURRENCY = 16
MAX_TOKENS = 64
JSON_SHARE = 4  # every 4th request asks for the schema
VLLM_STRUCTURED = ["--structured-outputs-config", json.dumps({"backend": "xgrammar", "disable_any_whitespace": True})]


def _body(models: list[str], index: int, with_json: bool) -> dict:
    """Request `index`: the models in turn; every JSON_SHARE-th turn of each model asks for the schema."""
    model = models[index % len(models)]
    body = {"model": model, "messages": [{"role": "user", "content": f"request {index}: judge this"}],
            "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    if with_json and (index // len(models)) % JSON_SHARE == 0:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": SCHEMA}}
    else:
        body["ignore_eos"] = True
    return body


async def _chat(client: httpx.AsyncClient, body: dict) -> tuple[float, int, bool]:
    """TTFT in seconds, completion tokens, and whether a constrained answer parsed."""
    started = time.perf_counter()
    first, tokens, text = None, None, ""
    async for chunk in sse_chunks(client, "/v1/chat/completions", body):
        if chunk.get("choices"):
            first = first if first is not None else time.perf_counter() - started
            text += chunk["choices"][0]["delta"].get("content") or ""
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
    if tokens is None:
        raise RuntimeError("the stream ended without a usage chunk")
    parsed = True
    if "response_format" in body:
        try:
            json.loads(text)  # strict: a raw control character in a string fails (xgrammar 0.2.8 lets them by)
        except json.JSONDecodeError:
            parsed = False
    return first or 0.0, tokens, parsed


async def _load(base_url: str, models: list[str], num_prompts: int, with_json: bool) -> dict:
    async with httpx.AsyncClient(base_url=base_url, timeout=600) as client:
        bodies = [_body(models, i, with_json) for i in range(num_prompts)]
        started = time.perf_counter()
        results = await bounded(CONCURRENCY, [lambda b=b: _chat(client, b) for b in bodies])
        wall = time.perf_counter() - started
    constrained = [r for b, r in zip(bodies, results) if "response_format" in b]
    free = [r for b, r in zip(bodies, results) if "response_format" not in b]
    return {
        "output_tok_s": sum(r[1] for r in results) / wall,
        "free_ttft_p50_ms": percentile_ms([r[0] for r in free], 50),
        "free_ttft_p99_ms": percentile_ms([r[0] for r in free], 99),
        "json_ttft_p50_ms": percentile_ms([r[0] for r in constrained], 50),
        "json_requests": len(constrained),
        "json_parsed": sum(r[2] for r in constrained),
        # unparsed answers cut by max_tokens (the rest would be a constraint that failed)
        "json_cut": sum(not r[2] and r[1] >= MAX_TOKENS for r in constrained),
        "json_mean_tokens": statistics.fmean(r[1] for r in constrained) if constrained else None,
    }


def run(out_dir: Path, quick: bool, demo: BenchModel) -> dict:
    adapters = dict(demo.adapter_dirs)
    models = [demo.model_id, *adapters]
    rounds = 1 if quick else 3
    num_prompts = 64 if quick else 128
    runs: dict[str, list[dict]] = {"loraplex": [], "vllm": []}
    for r in range(rounds):
        for server in ("loraplex", "vllm"):
            port = free_port()
            cmd = (loraplex_command(port, adapters, 4, 8, demo.model_dir) if server == "loraplex"
                   else [*vllm_command(port, demo.model_dir, demo.model_id, adapters, 4, 8), *VLLM_STRUCTURED])
            say(f"structured: round {r + 1}/{rounds}, {server}: starting server")
            with running(cmd, port, out_dir / f".structured-{server}.log") as base:
                row = {}
                for workload, with_json in (("free", False), ("json25", True)):
                    row[workload] = asyncio.run(_load(base, models, num_prompts, with_json))
                    say(f"  {server:8s} {workload:6s} {row[workload]['output_tok_s']:7.0f} tok/s "
                        f"free TTFT p50 {row[workload]['free_ttft_p50_ms']:6.1f} ms")
                row["ratio"] = row["json25"]["output_tok_s"] / row["free"]["output_tok_s"]
                runs[server].append(row)
    summary = []
    for server, rows in runs.items():
        def mean(workload, key, rows=rows):
            return statistics.fmean(r[workload][key] for r in rows)

        summary.append({
            "server": server,
            "free_tok_s": mean("free", "output_tok_s"),
            "json25_tok_s": mean("json25", "output_tok_s"),
            "ratio_per_round": [r["ratio"] for r in rows],
            "free_ttft_p50_ms": mean("free", "free_ttft_p50_ms"),
            "json25_free_ttft_p50_ms": mean("json25", "free_ttft_p50_ms"),
            "json25_json_ttft_p50_ms": mean("json25", "json_ttft_p50_ms"),
            "json_parsed": f"{sum(r['json25']['json_parsed'] for r in rows)}/"
                           f"{sum(r['json25']['json_requests'] for r in rows)}",
            "json_cut": sum(r["json25"]["json_cut"] for r in rows),
            "json_mean_tokens": mean("json25", "json_mean_tokens"),
        })
    return {"model": demo.model_id, "rounds": rounds, "models": models, "num_prompts": num_prompts,
            "concurrency": CONCURRENCY, "max_tokens": MAX_TOKENS, "runs": runs, "summary": summary}


def table(results: dict):
    headers = ["server", "free tok/s", "25% JSON tok/s", "25% JSON / free (per round)", "free TTFT p50 ms",
               "free TTFT p50 ms beside JSON", "JSON TTFT p50 ms", "JSON parsed", "unparsed: cut at max_tokens", "JSON tokens (mean)"]
    rows = [[s["server"], round(s["free_tok_s"]), round(s["json25_tok_s"]),
             ", ".join(f"{x:.3f}" for x in s["ratio_per_round"]), round(s["free_ttft_p50_ms"], 1),
             round(s["json25_free_ttft_p50_ms"], 1), round(s["json25_json_ttft_p50_ms"], 1), s["json_parsed"],
             s["json_cut"], round(s["json_mean_tokens"], 1)] for s in results["summary"]]
    return headers, rows
