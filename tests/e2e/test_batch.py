"""Batches on the real engine through the real `openai` SDK: mixed adapters per line, each line answered exactly
as the same request sent live, and live requests taking engine slots back from a running batch."""

from __future__ import annotations

import io
import json
import re
import time
from concurrent.futures import ThreadPoolExecutor

from tests.conftest import EXTRA_ADAPTER
from tests.engine_gate import EngineGate, wait_until


def jsonl(lines: list[dict]) -> io.BytesIO:
    return io.BytesIO("".join(json.dumps(line) + "\n" for line in lines).encode())


def wait_final(client, batch_id: str, timeout: float = 180):
    deadline = time.monotonic() + timeout
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "expired", "cancelled"):
            return batch
        assert time.monotonic() < deadline, f"batch {batch_id} still {batch.status}"
        time.sleep(0.2)


def test_a_batch_over_mixed_adapters_answers_as_live_requests_do(openai_client, base_model_id, adapter_names):
    models = [base_model_id, *adapter_names, EXTRA_ADAPTER, f"{adapter_names[0]}@1"]
    bodies = {f"q{i}-{model}": {"model": model, "max_tokens": 8, "temperature": 0,
                                "messages": [{"role": "user", "content": f"question {i} for {model}"}]}
              for i, model in enumerate(models)}
    completions = {"c-poet": {"model": adapter_names[-1], "prompt": "a poem about", "max_tokens": 6,
                              "temperature": 0}}
    chat_file = openai_client.files.create(
        file=("chat.jsonl", jsonl([{"custom_id": cid, "method": "POST", "url": "/v1/chat/completions", "body": b}
                                   for cid, b in bodies.items()])), purpose="batch")
    text_file = openai_client.files.create(
        file=("text.jsonl", jsonl([{"custom_id": cid, "method": "POST", "url": "/v1/completions", "body": b}
                                   for cid, b in completions.items()])), purpose="batch")
    chat = openai_client.batches.create(input_file_id=chat_file.id, endpoint="/v1/chat/completions",
                                        completion_window="24h")
    text = openai_client.batches.create(input_file_id=text_file.id, endpoint="/v1/completions",
                                        completion_window="24h")
    for batch, expected in ((chat, bodies), (text, completions)):
        done = wait_final(openai_client, batch.id)
        assert done.status == "completed", done.errors
        assert done.request_counts.completed == len(expected) and done.request_counts.failed == 0
        output = {line["custom_id"]: line for line in map(json.loads, openai_client.files.content(
            done.output_file_id).text.splitlines())}
        assert set(output) == set(expected)
        for cid, body in expected.items():
            answer = output[cid]["response"]["body"]
            if batch is chat:
                live = openai_client.chat.completions.create(**body)
                assert answer["choices"][0]["message"]["content"] == live.choices[0].message.content
            else:
                live = openai_client.completions.create(**body)
                assert answer["choices"][0]["text"] == live.choices[0].text
            assert answer["model"] == live.model
            assert (answer["usage"]["prompt_tokens"], answer["usage"]["completion_tokens"]) == (
                live.usage.prompt_tokens, live.usage.completion_tokens)


def test_live_requests_take_slots_back_from_a_running_batch(openai_client, server_process, base_model_id,
                                                            metrics_text):
    def preemptions() -> float:
        found = re.search(r"^loraplex_batch_preemptions_total (\S+)$", metrics_text(), re.M)
        return float(found.group(1)) if found else 0.0

    before = preemptions()
    lines = [{"custom_id": f"long-{i}", "method": "POST", "url": "/v1/completions",
              "body": {"model": base_model_id, "prompt": f"line {i}", "max_tokens": 64, "ignore_eos": True}}
             for i in range(24)]
    # The engine is held until the live request has preempted: the batch is still running when it arrives, by
    # construction.
    with ThreadPoolExecutor(1) as pool:
        with EngineGate.of(server_process.proc.pid):
            batch = openai_client.batches.create(
                input_file_id=openai_client.files.create(file=("long.jsonl", jsonl(lines)), purpose="batch").id,
                endpoint="/v1/completions", completion_window="24h")
            wait_until(lambda: re.search(r"^loraplex_batch_running_lines [1-9]",
                                         metrics_text("loraplex_batch_running_lines"), re.M), "the batch running")
            # ignore_eos: beside the batch's sequences a near-tie may pick the random tiny model's EOS.
            live = pool.submit(openai_client.completions.create, model=base_model_id, prompt="live", max_tokens=4,
                               extra_body={"ignore_eos": True})
            wait_until(lambda: preemptions() > before, "a batch line preempted for the live request")
        assert live.result().usage.completion_tokens == 4
    done = wait_final(openai_client, batch.id)
    assert done.status == "completed" and done.request_counts.completed == 24
    assert re.search(r'^loraplex_batches\{status="completed"\} [1-9]', metrics_text(), re.M)
