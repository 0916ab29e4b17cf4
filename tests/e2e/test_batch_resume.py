"""kill -9 in the middle of a batch: the restarted server runs only the lines left, and bills each line once.

A server of its own (small: the tiny demo, two batch lines at a time), with its own data home, so killing it
touches nothing of the session's server.
"""

from __future__ import annotations

import io
import json
import os
import sqlite3
import sys
import time

import pytest
from openai import OpenAI

from tests.conftest import ARTIFACTS, EAGER, TINY, ServerProcess
from tests.engine_gate import EngineGate

LINES = 40


@pytest.fixture(scope="module")
def resumable(demo_home, tmp_path_factory):
    home = tmp_path_factory.mktemp("resume-home")
    ARTIFACTS.mkdir(exist_ok=True)
    log_path = ARTIFACTS / "server-resume.log"
    log_path.write_text("")
    env = {**os.environ, "LORAPLEX_HOME": str(home), "LORAPLEX_DEMO_HOME": str(demo_home),
           "VLLM_CPU_KVCACHE_SPACE": "1", **EAGER}
    argv = [sys.executable, "-m", "api.cli", "serve", "--demo", TINY, "--dtype", "float32", "--max-num-seqs", "8",
            "--batch-max-running-lines", "2", "--drain-timeout-s", "5"]
    process = ServerProcess(argv, env, log_path)
    process.start()
    yield process, home
    if process.proc.poll() is None:
        process.stop()


def rows(path, sql: str, params=()) -> list[tuple]:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        return conn.execute(sql, params).fetchall()


def test_kill9_mid_batch_resumes_the_rest_without_running_or_billing_a_line_twice(resumable, base_model_id):
    process, home = resumable
    client = OpenAI(base_url=f"{process.url}/v1", api_key="unused", max_retries=0, timeout=60)
    lines = [{"custom_id": f"row-{i}", "method": "POST", "url": "/v1/completions",
              "body": {"model": base_model_id, "prompt": f"row {i}", "max_tokens": 48, "ignore_eos": True}}
             for i in range(LINES)]
    content = io.BytesIO("".join(json.dumps(line) + "\n" for line in lines).encode())
    # The engine runs only in pulses until 4 lines are done, and is held at the kill. The server is held during
    # each pulse, so a pulse can finish at most the 2 lines already in the engine, however long it lasts (a late
    # test process once let one pulse run all 40): the kill lands mid-batch by construction.
    with EngineGate.of(process.proc.pid) as gate:
        batch = client.batches.create(
            input_file_id=client.files.create(file=("in.jsonl", content), purpose="batch").id,
            endpoint="/v1/completions", completion_window="24h")
        gate.pulse_until(lambda: client.batches.retrieve(batch.id).request_counts.completed >= 4,
                        server_pid=process.proc.pid)
        process.kill9()

    store, ledger = home / "batches.sqlite", home / "usage.sqlite"
    before = dict(rows(store, "SELECT line, request_id FROM lines WHERE batch_id = ? AND state = 'done'", (batch.id,)))
    assert 4 <= len(before) < LINES, "kill -9 should land mid-batch"

    process.start()
    client = OpenAI(base_url=f"{process.url}/v1", api_key="unused", max_retries=0, timeout=60)
    deadline = time.monotonic() + 180
    while (done := client.batches.retrieve(batch.id)).status != "completed":
        assert time.monotonic() < deadline and done.status in ("in_progress", "finalizing"), done.status
        time.sleep(0.2)
    assert done.request_counts.completed == LINES and done.request_counts.failed == 0
    output = [json.loads(x) for x in client.files.content(done.output_file_id).text.splitlines()]
    assert sorted(x["custom_id"] for x in output) == sorted(line["custom_id"] for line in lines)
    after = dict(rows(store, "SELECT line, request_id FROM lines WHERE batch_id = ?", (batch.id,)))
    assert {line: after[line] for line in before} == before  # lines finished before the kill did not run again
    billed = [r[0] for r in rows(ledger, "SELECT request_id FROM usage WHERE request_id LIKE ? "
                                         "AND status = 200", (f"{batch.id}:%",))]
    assert sorted(billed) == sorted(f"{batch.id}:{n}" for n in range(1, LINES + 1))  # once each, no suffixed twin
