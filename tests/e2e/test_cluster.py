"""Scale-out mode end to end: `loraplex serve --replicas 2` (two engines on Ray Serve) behind one OpenAI endpoint.

One server for the module, on the tiny demo, with the session's tenants. The replica-kill test runs last.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.conftest import ARTIFACTS, EXTRA_ADAPTER, TINY, ServerProcess, _alive, _descendants
from tests.engine_gate import EngineGate, StreamReader, wait_until
from tests.otlp import OtlpCollector

MAX_TOKENS = 16
PROMPT = "Hello world, the quick brown fox"
REPLACE_TIMEOUT_S = 240
HELD = "sql-helper"  # asks for both replicas (--adapter-replicas)


@pytest.fixture(scope="module")
def collector():
    """Where the server and its replicas export their spans."""
    otlp = OtlpCollector()
    yield otlp
    otlp.stop()


@pytest.fixture(scope="module")
def cluster(demo_home, adapter_dirs, tenants_file, tmp_path_factory, collector):
    ARTIFACTS.mkdir(exist_ok=True)
    log_path = ARTIFACTS / "server-cluster.log"
    log_path.write_text("")
    env = {**os.environ, "LORAPLEX_HOME": str(demo_home), "VLLM_CPU_KVCACHE_SPACE": "1"}
    ledger = tmp_path_factory.mktemp("cluster") / "usage.sqlite"
    # --max-num-seqs as the session server's: the same compile-cache key (vLLM hashes it), so the replicas compile
    # from the session's warm inductor cache (warm-up 30 s side by side in a fresh-clone run, 38 s cold).
    argv = [sys.executable, "-m", "api.cli", "serve", "--demo", TINY, "--dtype", "float32",
            "--config", str(tenants_file),
            "--replicas", "2", "--affinity-max-ongoing", "2", "--replica-stats-period-s", "0.5",
            "--max-loras", "2", "--max-cpu-loras", "4", "--max-num-seqs", "32", "--max-model-len", "1024",
            "--kv-cache-gib", "0.25", "--ledger-url", str(ledger), "--drain-timeout-s", "10",
            "--otlp-endpoint", collector.url, "--adapter", f"{EXTRA_ADAPTER}={adapter_dirs[EXTRA_ADAPTER]}",
            "--adapter-replicas", f"{HELD}=2"]
    process = ServerProcess(argv, env, log_path)
    process.start()
    yield process
    if process.proc.poll() is None:
        process.children |= _descendants(process.proc.pid)  # replicas Ray started since, too
        assert process.stop() == 0


def _status(cluster, keys) -> dict:
    response = httpx.get(f"{cluster.url}/cluster", headers=keys.admin_headers, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def _requests_by_replica(status: dict) -> dict[str, int]:
    return {r["replica_id"]: r["requests"] for r in status["replicas"]}


def _holders(status: dict, label: str) -> set[str]:
    return {r["replica_id"] for r in status["replicas"] if label in r["residency"]["cpu"]}


def _complete(url: str, headers: dict, model: str, **extra) -> httpx.Response:
    body = {"model": model, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True, **extra}
    return httpx.post(f"{url}/v1/completions", headers=headers, json=body, timeout=120)


def _streamed_token_ids(url: str, headers: dict, model: str) -> list[int]:
    ids = []
    with httpx.stream("POST", f"{url}/v1/completions", headers=headers, timeout=120,
                      json={"model": model, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0,
                            "ignore_eos": True, "return_token_ids": True, "stream": True}) as response:
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                ids += json.loads(line[len("data: "):])["choices"][0].get("token_ids") or []
    return ids


def test_greedy_outputs_equal_the_single_process_server(cluster, server, acme, base_model_id, adapter_names):
    for model in [base_model_id, *adapter_names, EXTRA_ADAPTER]:
        single = _complete(server, acme, model)
        through_ray = _complete(cluster.url, acme, model)
        assert single.status_code == through_ray.status_code == 200, through_ray.text
        expected = single.json()["choices"][0]["token_ids"]
        assert len(expected) == MAX_TOKENS
        assert through_ray.json()["choices"][0]["token_ids"] == expected, model
        assert through_ray.headers["x-loraplex-model"] == single.headers["x-loraplex-model"]
        assert _streamed_token_ids(cluster.url, acme, model) == expected, f"{model}, streamed"


def test_an_adapter_asking_for_two_replicas_is_held_by_both(cluster, keys):
    """The greedy test above sent it twice, one after the other: affinity alone would have loaded it on one
    replica. Both preloaded it at their start, and it is pinned there."""
    status = _status(cluster, keys)
    assert len(status["replicas"]) == 2, "both replicas have served (the greedy test sends to each)"
    assert _holders(status, f"{HELD}@1") == {r["replica_id"] for r in status["replicas"]}


def test_a_trace_crosses_the_ray_hop(cluster, collector, acme):
    request_id = f"traced-{uuid.uuid4().hex}"
    assert _complete(cluster.url, {**acme, "X-Request-Id": request_id}, "poet").status_code == 200
    deadline = time.monotonic() + 60  # spans leave in batches, every 5 s
    while True:
        spans = collector.spans()
        roots = [span for service, span in spans if service == "loraplex" and span.name == "http.request"
                 and _attributes(span).get("request_id") == request_id]
        replica = [span for service, span in spans if service == "loraplex-replica"
                   and any(span.trace_id == root.trace_id for root in roots)]
        if replica:
            break
        assert time.monotonic() < deadline, sorted((service, span.name) for service, span in spans)
        time.sleep(0.5)
    [root] = roots
    [replica_span] = replica
    server_spans = {span.span_id: span for service, span in spans if service == "loraplex"
                    and span.trace_id == root.trace_id}
    assert replica_span.name == "replica.generate"
    assert replica_span.parent_span_id in server_spans, "the replica's span is not a child of the server's"
    assert _attributes(replica_span)["adapter"] == "poet@1"


def _attributes(span) -> dict[str, str]:
    return {a.key: a.value.string_value for a in span.attributes}


def test_a_warm_adapters_requests_land_on_its_holder(cluster, keys, acme):
    assert _complete(cluster.url, acme, "poet").status_code == 200
    before = _status(cluster, keys)
    holders = _holders(before, "poet@1")
    assert len(holders) == 1, before
    for _ in range(4):
        assert _complete(cluster.url, acme, "poet").status_code == 200
    after = _status(cluster, keys)
    taken = {rid: n - _requests_by_replica(before).get(rid, 0) for rid, n in _requests_by_replica(after).items()}
    assert {rid for rid, n in taken.items() if n} == holders and sum(taken.values()) == 4
    assert _holders(after, "poet@1") == holders  # nobody else loaded it


def test_a_hot_adapter_spreads_over_replicas(cluster, keys, acme):
    assert _complete(cluster.url, acme, "support-bot").status_code == 200
    before = _status(cluster, keys)
    assert len(_holders(before, "support-bot@1")) == 1
    assert len(before["replicas"]) == 2, "both replicas have served (the greedy test sends to each)"
    routed_before = sum(_requests_by_replica(before).values())

    def stream(_) -> int:
        with httpx.stream("POST", f"{cluster.url}/v1/completions", headers=acme, timeout=300,
                          json={"model": "support-bot", "prompt": PROMPT, "max_tokens": 32, "ignore_eos": True,
                                "stream": True}) as response:
            for _line in response.iter_lines():
                pass
            return response.status_code

    # Both engines held while the 8 are routed: all 8 are ongoing at once, whatever the machine's speed.
    gate = EngineGate([pid for r in before["replicas"] for pid in _descendants(r["pid"])])
    with ThreadPoolExecutor(8) as pool:
        with gate:
            futures = [pool.submit(stream, i) for i in range(8)]
            wait_until(lambda: sum(_requests_by_replica(_status(cluster, keys)).values()) == routed_before + 8,
                       "all 8 routed")
        assert [f.result() for f in futures] == [200] * 8
    after = _status(cluster, keys)
    assert len(after["replicas"]) == 2
    # More than --affinity-max-ongoing (2) at once on its holder: the other replica loaded it and took some.
    assert _holders(after, "support-bot@1") == {r["replica_id"] for r in after["replicas"]}
    taken = {rid: n - _requests_by_replica(before).get(rid, 0) for rid, n in _requests_by_replica(after).items()}
    assert all(n > 0 for n in taken.values()) and sum(taken.values()) == 8, taken


def test_tenant_limits_are_exact_across_replicas(cluster, keys):
    tiny = keys.headers("tiny")  # 3 requests per minute
    with ThreadPoolExecutor(5) as pool:
        statuses = sorted(pool.map(lambda _: _complete(cluster.url, tiny, "sql-helper", max_tokens=4).status_code,
                                   range(5)))
    assert statuses == [200, 200, 200, 429, 429]


def _replica_report(cluster, keys, replica_id: str) -> dict:
    return next(r for r in _status(cluster, keys)["replicas"] if r["replica_id"] == replica_id)


def test_a_dropped_stream_is_aborted_on_its_replica(cluster, collector, keys, acme):
    # An adapter only the first test used, so it has one holder (the others may have spread by now).
    assert _complete(cluster.url, acme, EXTRA_ADAPTER, max_tokens=1).status_code == 200
    (holder,) = _holders(_status(cluster, keys), f"{EXTRA_ADAPTER}@1")
    report = _replica_report(cluster, keys, holder)
    before = report["generation_tokens"]
    request_id = f"dropped-{uuid.uuid4().hex}"
    # The holder's engine is held while the client goes and the cancellation crosses the Ray hop, so the abort
    # reaches it mid-stream by construction.
    with EngineGate.of(report["pid"]) as gate:
        stream = StreamReader(f"{cluster.url}/v1/completions", {**acme, "X-Request-Id": request_id},
                              {"model": EXTRA_ADAPTER, "prompt": PROMPT, "max_tokens": 1000, "ignore_eos": True,
                               "stream": True})
        gate.pulse_until(lambda: bool(stream.chunks))
        stream.drop()
        # The replica's span ends when its generate call is cancelled, after the engine was told to abort.
        wait_until(lambda: _replica_span(collector, request_id) is not None, "the replica's call ended")
    # Each probe is routed to the holder (affinity) and brings back its report from when it left: the calls still in
    # progress on the replica.
    deadline = time.monotonic() + 60
    while True:
        assert _complete(cluster.url, acme, EXTRA_ADAPTER, max_tokens=1).status_code == 200
        report = _replica_report(cluster, keys, holder)
        if report["ongoing"] == 0:
            break
        assert time.monotonic() < deadline, "the dropped stream is still running on its replica"
    probes_and_stream = report["generation_tokens"] - before
    assert probes_and_stream < 1000, "the engine generated the whole dropped stream"


def _replica_span(collector, request_id: str):
    """The replica's span of the request the server knows as `request_id` (its X-Request-Id), once exported."""
    spans = collector.spans()
    traces = {span.trace_id for service, span in spans if service == "loraplex" and span.name == "engine.generate"
              and _attributes(span).get("request_id") == request_id}
    return next((span for service, span in spans if service == "loraplex-replica" and span.name == "replica.generate"
                 and span.trace_id in traces), None)


def test_a_replica_killed_mid_stream(cluster, keys):
    solo = keys.headers("solo")  # max_concurrent 1: the killed stream's reservation must come back
    killed_id = f"kill-{uuid.uuid4().hex}"
    # The victim is chosen before the stream (affinity sends poet to its one holder); its engine is held from
    # before the stream to the kill, so the kill lands mid-stream by construction. A wrong victim would let the
    # stream end normally, which fails below.
    assert _complete(cluster.url, solo, "poet", max_tokens=1).status_code == 200  # resident on one replica
    (holder,) = _holders(_status(cluster, keys), "poet@1")
    victim = _replica_report(cluster, keys, holder)
    engine_processes = _descendants(victim["pid"])
    assert engine_processes, "the replica's vLLM engine core runs in a child process"
    with EngineGate(engine_processes) as gate:
        stream = StreamReader(f"{cluster.url}/v1/completions", {**solo, "X-Request-Id": killed_id},
                              {"model": "poet", "prompt": PROMPT, "max_tokens": 1000, "ignore_eos": True,
                               "stream": True})
        gate.pulse_until(lambda: bool(stream.chunks))
        os.kill(victim["pid"], signal.SIGKILL)
    stream.join()  # released: the engine processes may see their replica gone and exit
    assert stream.events[-1] == "[DONE]"
    error = json.loads(stream.events[-2])
    assert set(error) == {"error"} and set(error["error"]) == {"message", "type", "param", "code"}
    assert error["error"]["code"] == "engine_error"

    after_ids = [f"after-kill-{i}-{uuid.uuid4().hex}" for i in range(4)]
    for request_id in after_ids:  # one at a time: solo's one concurrent request was given back
        response = _complete(cluster.url, {**solo, "X-Request-Id": request_id}, "poet", max_tokens=4)
        assert response.status_code == 200, response.text

    deadline = time.monotonic() + REPLACE_TIMEOUT_S
    while _status(cluster, keys)["replica_states"].get("RUNNING") != 2:
        assert time.monotonic() < deadline, "Ray did not replace the killed replica"
        time.sleep(1)
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in engine_processes):
        assert time.monotonic() < deadline, "the killed replica's engine processes outlived it"
        time.sleep(0.5)

    rows = httpx.get(f"{cluster.url}/v1/usage?tenant=solo&limit=1000", headers=keys.admin_headers).json()["data"]
    by_id = {row["request_id"]: row for row in rows}
    assert by_id[killed_id]["status"] == 500 and by_id[killed_id]["completion_tokens"] > 0
    assert all(by_id[i]["status"] == 200 for i in after_ids)
