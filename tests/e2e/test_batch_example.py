"""examples/prefect_batch_flow.py run for real: Prefect (in its own venv, `make examples-venv`: it pins a newer
FastAPI than loraplex) runs the flow against the session's server, as a nightly job would against `make serve`
(the session's server is `--demo tiny` rather than the embedded SmolLM2, for speed)."""

from __future__ import annotations

import json
import os
import subprocess

from tests.conftest import REPO

PYTHON = REPO / "examples" / ".venv" / "bin" / "python"
FLOW = REPO / "examples" / "prefect_batch_flow.py"
FLOW_TIMEOUT_S = 240


def test_the_prefect_flow_uploads_runs_and_writes_a_batch(server, keys, base_model_id, adapter_names, tmp_path):
    assert PYTHON.exists(), "the example's venv is missing: run `make examples-venv` (make test does)"
    models = [base_model_id, *adapter_names]
    requests = tmp_path / "requests.jsonl"
    requests.write_text("".join(json.dumps({
        "custom_id": f"ticket-{i}", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": models[i % len(models)], "max_tokens": 5,
                 "messages": [{"role": "user", "content": f"classify ticket {i}"}]}}) + "\n" for i in range(8)))
    results = tmp_path / "results.jsonl"
    # Prefect's temporary API server counts 20 s of its own polling by default before giving up, which a busy one-core
    # machine can take to start it; the flow goes on as soon as that server answers, so this is only a ceiling.
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"), "DO_NOT_TRACK": "1",
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PYTHONPATH": "",
           "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": str(FLOW_TIMEOUT_S)}
    run = subprocess.run([str(PYTHON), str(FLOW), str(requests), str(results), "--base-url", f"{server}/v1",
                          "--api-key", keys.tenants["acme"], "--poll-s", "0.2"],
                         env=env, capture_output=True, text=True, timeout=FLOW_TIMEOUT_S)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    assert summary["results"] == 8 and summary["errors"] == 0 and summary["batch_id"].startswith("batch_")
    lines = [json.loads(line) for line in results.read_text().splitlines()]
    assert sorted(line["custom_id"] for line in lines) == sorted(f"ticket-{i}" for i in range(8))
    assert {line["response"]["body"]["model"].split("@")[0] for line in lines} == set(models)
