"""A nightly batch job as a Prefect flow against loraplex: upload a JSONL file of requests, start a batch, wait
for it, write the results (one JSON line per input line, matched by `custom_id`) and the failures beside them.

    python examples/prefect_batch_flow.py requests.jsonl results.jsonl --base-url http://127.0.0.1:8000/v1

It talks to loraplex only through the `openai` SDK (Files and Batches), so the same flow runs against OpenAI.
Prefect retries a task that fails (a server restarting mid-job answers again, and the batch it started resumes on
its own, so `wait_for` simply polls on).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from openai import OpenAI
from prefect import flow, get_run_logger, task

FINAL = ("completed", "failed", "expired", "cancelled")


def _client(base_url: str, api_key: str) -> OpenAI:
    return OpenAI(base_url=base_url, api_key=api_key, max_retries=3, timeout=60)


@task(retries=2, retry_delay_seconds=5)
def upload(base_url: str, api_key: str, path: str) -> str:
    with open(path, "rb") as f:
        return _client(base_url, api_key).files.create(file=(Path(path).name, f), purpose="batch").id


@task
def start(base_url: str, api_key: str, file_id: str, endpoint: str, window: str, run_name: str) -> str:
    batch = _client(base_url, api_key).batches.create(input_file_id=file_id, endpoint=endpoint,
                                                      completion_window=window, metadata={"flow_run": run_name})
    return batch.id


@task(retries=3, retry_delay_seconds=10)
def wait_for(base_url: str, api_key: str, batch_id: str, poll_s: float, timeout_s: float) -> dict:
    logger = get_run_logger()
    client, deadline = _client(base_url, api_key), time.monotonic() + timeout_s
    while (batch := client.batches.retrieve(batch_id)).status not in FINAL:
        counts = batch.request_counts
        logger.info("%s %s: %d/%d done, %d failed", batch_id, batch.status, counts.completed, counts.total,
                    counts.failed)
        if time.monotonic() > deadline:
            raise TimeoutError(f"batch {batch_id} still {batch.status} after {timeout_s} s")
        time.sleep(poll_s)
    return batch.model_dump()


@task
def write_results(base_url: str, api_key: str, batch: dict, out_path: str) -> dict:
    """Results to `out_path`, failures (with their errors) to `<out_path>.errors.jsonl`; returns the counts."""
    client = _client(base_url, api_key)
    written = {"results": 0, "errors": 0}
    for key, file_id, path in (("results", batch["output_file_id"], out_path),
                               ("errors", batch["error_file_id"], f"{out_path}.errors.jsonl")):
        if not file_id:
            continue
        lines = client.files.content(file_id).text.splitlines()
        Path(path).write_text("".join(line + "\n" for line in lines))
        written[key] = len(lines)
    return written


@flow(name="loraplex-batch")
def batch_flow(input_path: str, output_path: str, base_url: str = "http://127.0.0.1:8000/v1", api_key: str = "none",
               endpoint: str = "/v1/chat/completions", window: str = "24h", poll_s: float = 2.0,
               timeout_s: float = 24 * 3600) -> dict:
    file_id = upload(base_url, api_key, input_path)
    batch_id = start(base_url, api_key, file_id, endpoint, window, "loraplex-batch")
    batch = wait_for(base_url, api_key, batch_id, poll_s, timeout_s)
    if batch["status"] != "completed":
        raise RuntimeError(f"batch {batch_id} ended {batch['status']}: {json.dumps(batch.get('errors'))}")
    return {"batch_id": batch_id, **write_results(base_url, api_key, batch, output_path)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("input", help="JSONL file of batch request lines")
    parser.add_argument("output", help="where the result lines go")
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--api-key", default="none", help="the tenant's API key (default: none, an open server)")
    parser.add_argument("--endpoint", default="/v1/chat/completions", choices=["/v1/chat/completions",
                                                                               "/v1/completions"])
    parser.add_argument("--poll-s", type=float, default=2.0)
    args = parser.parse_args()
    print(json.dumps(batch_flow(args.input, args.output, args.base_url, args.api_key, args.endpoint,
                                poll_s=args.poll_s)))


if __name__ == "__main__":
    main()
