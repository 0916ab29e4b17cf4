"""Schemathesis against a real `loraplex serve` (real vLLM engine) on loopback, from the server's own OpenAPI
schema: positive and negative requests for every operation, then checks that nothing is left in flight and
the engine is alive.

    python scripts/fuzz_api.py --examples 150     # about 2,500 requests; writes docs/results/fuzz-*.json

Generation requests keep what schemathesis generated, except that an output limit above 16 tokens (or none)
becomes 16, so that thousands of requests fit in minutes on two cores. The suite's own, faster run against
the fake engine is tests/api/test_schemathesis.py.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import Counter

import httpx
import schemathesis
from bench_servers import REPO, free_port, loraplex_command, own_state, running, say
from hypothesis import HealthCheck, given, settings

GENERATION = ("/v1/chat/completions", "/v1/completions", "/invocations")
MAX_TOKENS = 16


def bounded(case) -> None:
    """Caps the output of generation requests whose body is an object (other bodies go as generated)."""
    if case.path in GENERATION and isinstance(case.body, dict):
        for field in ("max_tokens", "max_completion_tokens"):
            value = case.body.get(field)
            if isinstance(value, int) and not isinstance(value, bool) and value > MAX_TOKENS:
                case.body[field] = MAX_TOKENS
        if "max_tokens" not in case.body and "max_completion_tokens" not in case.body:
            case.body["max_tokens"] = MAX_TOKENS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=150, help="examples per operation (default %(default)s)")
    args = parser.parse_args()
    statuses: Counter[int] = Counter()
    server_errors: list[str] = []
    with tempfile.TemporaryDirectory(prefix="loraplex-fuzz-") as state:
        port = free_port()
        cmd = loraplex_command(port, {}, max_loras=4, max_cpu_loras=8, extra=own_state(state))
        with running(cmd, port, REPO / "docs" / "results" / ".fuzz-server.log", ready_path="/ready") as base:
            schema = schemathesis.openapi.from_url(f"{base}/openapi.json")
            started = time.monotonic()
            for result in schema.get_all_operations():
                operation = result.ok()

                @given(case=operation.as_strategy())
                @settings(max_examples=args.examples, deadline=None, suppress_health_check=list(HealthCheck))
                def call(case) -> None:
                    bounded(case)
                    response = case.call(base_url=base, timeout=120)
                    statuses[response.status_code] += 1
                    if response.status_code >= 500:
                        server_errors.append(f"{case.method} {case.formatted_path} -> {response.status_code}: "
                                             f"{response.text[:200]}")

                say(f"{operation.method.upper()} {operation.path}")
                call()
            elapsed = time.monotonic() - started
            metrics = httpx.get(f"{base}/metrics", timeout=30).text
            in_flight = next(float(line.split()[-1]) for line in metrics.splitlines()
                             if line.startswith("loraplex_requests_in_flight "))
            alive = httpx.get(f"{base}/health", timeout=30).status_code == 200
            served = httpx.post(f"{base}/v1/completions", timeout=60, json={
                "model": "loraplex/tiny-llama", "prompt": "hi", "max_tokens": 2}).status_code
    summary = {"requests": sum(statuses.values()), "seconds": round(elapsed, 1),
               "statuses": {str(k): v for k, v in sorted(statuses.items())}, "server_errors": server_errors,
               "in_flight_after": in_flight, "engine_alive_after": alive, "completion_after": served}
    out = REPO / "docs" / "results" / f"fuzz-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    out.write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    say(f"wrote {out}")


if __name__ == "__main__":
    main()
