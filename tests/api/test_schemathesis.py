"""Property-based requests generated from the server's own OpenAPI schema (schemathesis), valid and invalid,
through the real HTTP layer around the fake engine: no 5xx, every error OpenAI-shaped, nothing left held.
The long run against the real engine is `scripts/fuzz_api.py` (docs/reliability.md)."""

from __future__ import annotations

import schemathesis
from hypothesis import HealthCheck, Phase, given, settings

from api.app import create_app

# Per operation: enough to reach every body field's edge cases in the suite's time; scripts/fuzz_api.py runs more.
EXAMPLES = 100


def test_generated_requests_never_get_a_server_error(fake_server):
    schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(fake_server))
    calls: list[str] = []
    for result in schema.get_all_operations():
        operation = result.ok()

        @given(case=operation.as_strategy())
        # No explain phase: it traces the whole process (sys.settrace), which slowed the e2e tests that follow in
        # the same pytest process enough for a 1000-token stream to end before their next request.
        @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
                  phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink))
        def check(case) -> None:
            response = case.call()
            calls.append(f"{case.method} {case.path}")
            assert response.status_code < 500, (
                f"{case.method} {case.formatted_path}: {response.status_code} {response.text[:300]}")
            content_type = response.headers.get("content-type", "")
            content_type = content_type[0] if isinstance(content_type, list) else content_type
            if response.status_code >= 400 and content_type.startswith("application/json"):
                assert set(response.json()["error"]) == {"message", "type", "param", "code"}, response.text
            queue = fake_server.pipeline.admission.queue
            assert fake_server.lifecycle.in_flight == 0 and queue.running == 0 and len(queue._queue) == 0

        check()
    generation = [c for c in calls if c.endswith("/completions")]
    print(f"{len(calls)} generated requests, {len(generation)} to the generation routes")
    assert len(calls) >= 1000 and len(generation) >= EXAMPLES, (len(calls), len(generation))
