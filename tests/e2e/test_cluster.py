"""Scale-out mode end to end: `loraplex serve --replicas 2` (two engines on Ray Serve) behind one OpenAI endpoint,
on a real two-node Ray cluster (each node its own `ray start`) with the state on PostgreSQL, Redis and S3.

One server for the module, on the tiny demo, with the session's tenants. The node-loss test runs last.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from openai import OpenAI

from tests.conftest import ARTIFACTS, EAGER, EXTRA_ADAPTER, TINY, ServerProcess, _descendants, new_s3_bucket
from tests.e2e.test_batch import jsonl, wait_final
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
def ray_cluster(ray_cluster_launch):
    """A head node and a second node, each its own `ray start` with one CPU, token authentication on (launched at
    the session's start); killed when the module is done."""
    ray_cluster_launch.wait_started()
    yield ray_cluster_launch
    ray_cluster_launch.kill()


@pytest.fixture(scope="module")
def cluster(demo_home, adapter_dirs, tenants_file, tmp_path_factory, collector, ray_cluster, postgres_server,
            redis_server, s3_endpoint):
    """`serve --replicas 2` joining the two-node cluster, with its state on real servers: ledger and registry index
    on PostgreSQL, limits on Redis, adapter blobs and batch files on S3."""
    ARTIFACTS.mkdir(exist_ok=True)
    log_path = ARTIFACTS / "server-cluster.log"
    log_path.write_text("")
    # Eager replicas: what these tests claim does not depend on the compiled graph (the session server's exactness
    # tests cover it), and three engine starts (two, and a replacement) are the module's longest waits.
    env = {**ray_cluster.env, "LORAPLEX_HOME": str(demo_home), "VLLM_CPU_KVCACHE_SPACE": "1", **EAGER}
    bucket = new_s3_bucket(s3_endpoint)
    home = tmp_path_factory.mktemp("cluster")  # its own batch store: the session server's would run its lines
    argv = [sys.executable, "-m", "api.cli", "serve", "--demo", TINY, "--dtype", "float32",
            "--config", str(tenants_file),
            "--replicas", "2", "--ray-address", ray_cluster.address,
            "--affinity-max-ongoing", "2", "--replica-stats-period-s", "0.5",
            "--max-loras", "2", "--max-cpu-loras", "4", "--max-num-seqs", "32", "--max-model-len", "1024",
            "--kv-cache-gib", "0.25", "--drain-timeout-s", "10",
            "--ledger-url", postgres_server.new_database(), "--index-url", postgres_server.new_database(),
            "--limits-url", redis_server.url, "--store-uri", f"s3://{bucket}/blobs",
            "--files-store-uri", f"s3://{bucket}/files", "--batch-store-path", str(home / "batches.sqlite"),
            "--otlp-endpoint", collector.url, "--adapter", f"{EXTRA_ADAPTER}={adapter_dirs[EXTRA_ADAPTER]}",
            "--adapter-replicas", f"{HELD}=2"]
    process = ServerProcess(argv, env, log_path)
    process.start()
    yield process
    if process.proc.poll() is None:
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


def _stream_body(model: str, max_tokens: int) -> dict:
    return {"model": model, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True, "stream": True}


def _token_ids(stream: StreamReader) -> list[int]:
    return [i for chunk in stream.chunks for choice in chunk.get("choices", []) for i in choice.get("token_ids") or []]


def _routed(cluster, keys) -> dict[str, int]:
    return _requests_by_replica(_status(cluster, keys))


def test_the_replicas_run_on_both_nodes(cluster, ray_cluster, keys):
    """Replicas reserve no CPU; the per-node cap (2 replicas over 2 nodes: 1) is what spreads them."""
    replicas = _status(cluster, keys)["replicas"]
    assert len(replicas) == 2, "both replicas have served (the greedy test sends to each)"
    assert {ray_cluster.node_of(r["pid"]) for r in replicas} == set(ray_cluster.nodes)
    assert len({r["node_id"] for r in replicas}) == 2


def test_the_replicas_engines_run_at_the_servers_priority(cluster, keys):
    """Ray starts its workers at niceness 15 (below its daemons and this server); a replica and its engine's
    processes (the engine core and its workers, the replica's descendants) run at 0, as the nodes do."""
    replicas = _status(cluster, keys)["replicas"]
    assert len(replicas) == 2, "both replicas have served (the greedy test sends to each)"
    for replica in replicas:
        processes = [replica["pid"], *_descendants(replica["pid"])]
        assert len(processes) >= 3, "the replica, its engine core and a worker"
        assert {pid: os.getpriority(os.PRIO_PROCESS, pid) for pid in processes} == dict.fromkeys(processes, 0)


def test_a_batch_runs_exact_through_both_nodes(cluster, server, keys, base_model_id, adapter_names):
    models = [base_model_id, *adapter_names, EXTRA_ADAPTER]
    bodies = {f"line-{i}": {"model": model, "prompt": f"{PROMPT} {i}", "max_tokens": 8, "temperature": 0,
                            "ignore_eos": True} for i, model in enumerate(models * 2)}
    routed = _routed(cluster, keys)
    client = OpenAI(base_url=f"{cluster.url}/v1", api_key=keys.tenants["acme"], max_retries=0, timeout=120)
    lines = [{"custom_id": cid, "method": "POST", "url": "/v1/completions", "body": body}
             for cid, body in bodies.items()]
    uploaded = client.files.create(file=("lines.jsonl", jsonl(lines)), purpose="batch")
    batch = wait_final(client, client.batches.create(input_file_id=uploaded.id, endpoint="/v1/completions",
                                                     completion_window="24h").id)
    assert batch.status == "completed" and batch.request_counts.completed == len(bodies), batch.errors
    output = {line["custom_id"]: line["response"]["body"]
              for line in map(json.loads, client.files.content(batch.output_file_id).text.splitlines())}
    assert sum(_routed(cluster, keys).values()) - sum(routed.values()) == len(bodies), "not run by the replicas"
    for cid, body in bodies.items():
        single = httpx.post(f"{server}/v1/completions", headers=keys.headers("acme"), json=body, timeout=120)
        assert output[cid]["choices"][0]["text"] == single.json()["choices"][0]["text"], cid


def test_a_node_lost_mid_traffic(cluster, ray_cluster, keys):
    """The second node is lost as a host is (its raylet, replica and engine killed at once) while four streams
    run, two on each replica: the two on it end with an error event, the others run to their end; new requests go
    to the survivor at once; every request has one ledger row; the replica comes back when the node does."""
    quad = keys.headers("quad")  # max_concurrent 4: the reservations of the streams on the lost node must come back
    node = ray_cluster.workers[0]
    status = _status(cluster, keys)
    by_node = {ray_cluster.node_of(r["pid"]): r for r in status["replicas"]}
    lost, survivor = by_node[node], by_node[ray_cluster.head]
    engines = {r["replica_id"]: _descendants(r["pid"]) for r in (lost, survivor)}
    assert all(engines.values()), "each replica's vLLM engine core runs in a child process"
    stream_ids = [f"node-loss-{i}-{uuid.uuid4().hex}" for i in range(4)]
    before = _routed(cluster, keys)
    # Both engines are held from before the streams to the kill: the kill lands mid-stream by construction. HELD is
    # resident on both, so each stream goes to the less loaded of the two (sent one at a time, once the last one
    # reached its replica): two each.
    with EngineGate([pid for pids in engines.values() for pid in pids]) as gate:
        streams = []
        for request_id in stream_ids:
            streams.append(StreamReader(f"{cluster.url}/v1/completions", {**quad, "X-Request-Id": request_id},
                                        _stream_body(HELD, 400)))
            wait_until(lambda: sum(_routed(cluster, keys).values()) == sum(before.values()) + len(streams),
                       "the stream reached a replica")
        taken = {rid: n - before.get(rid, 0) for rid, n in _routed(cluster, keys).items()}
        assert taken == {lost["replica_id"]: 2, survivor["replica_id"]: 2}, taken
        gate.pulse_until(lambda: all(s.chunks for s in streams))
        node.kill()
    for stream in streams:
        stream.join()

    ended: dict[str, list[StreamReader]] = {"error": [], "done": []}
    for stream in streams:
        assert stream.events[-1] == "[DONE]"
        last = json.loads(stream.events[-2])
        ended["error" if "error" in last else "done"].append(stream)
    assert len(ended["error"]) == len(ended["done"]) == 2, [s.events[-2] for s in streams]
    for stream in ended["error"]:
        error = json.loads(stream.events[-2])["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["code"] == "engine_error"
    full = _token_ids(ended["done"][0])
    assert len(full) == 400 and _token_ids(ended["done"][1]) == full
    for stream in ended["error"]:  # cut, never repeated: what was sent is the greedy answer's beginning
        sent = _token_ids(stream)
        assert 0 < len(sent) < 400 and sent == full[:len(sent)]

    # The node is still down: new requests go to the survivor, and quad's four reservations are all free (its
    # four requests are admitted together while the survivor's engine is held).
    after_ids = [f"after-loss-{i}-{uuid.uuid4().hex}" for i in range(4)]
    routed = _routed(cluster, keys)
    with ThreadPoolExecutor(4) as pool:
        with EngineGate(engines[survivor["replica_id"]]):
            futures = [pool.submit(_complete, cluster.url, {**quad, "X-Request-Id": request_id}, model, max_tokens=4)
                       for request_id, model in zip(after_ids, [HELD, "poet", "support-bot", EXTRA_ADAPTER])]
            wait_until(lambda: _routed(cluster, keys)[survivor["replica_id"]] == routed[survivor["replica_id"]] + 4,
                       "all four admitted and sent to the survivor")
        assert [f.result().status_code for f in futures] == [200] * 4, [f.result().text for f in futures]

    rows = httpx.get(f"{cluster.url}/v1/usage?tenant=quad&limit=1000", headers=keys.admin_headers).json()["data"]
    counts = {request_id: [row for row in rows if row["request_id"] == request_id]
              for request_id in stream_ids + after_ids}
    assert all(len(found) == 1 for found in counts.values()), {k: len(v) for k, v in counts.items()}
    by_id = {request_id: found[0] for request_id, found in counts.items()}
    for stream, request_id in zip(streams, stream_ids):
        row = by_id[request_id]
        assert (row["status"], row["completion_tokens"]) == ((500 if stream in ended["error"] else 200),
                                                             len(_token_ids(stream))), row
    assert all(by_id[request_id]["status"] == 200 for request_id in after_ids)

    # The node comes back: Ray Serve places the lost replica's replacement there (the survivor's node is at its
    # cap), and it holds what the lost one held.
    node.start()
    node.wait_started()
    deadline = time.monotonic() + REPLACE_TIMEOUT_S
    while _status(cluster, keys)["replica_states"].get("RUNNING") != 2:
        assert time.monotonic() < deadline, "Ray did not replace the lost replica"
        time.sleep(1)
    known = {lost["replica_id"], survivor["replica_id"]}
    deadline = time.monotonic() + 60
    while not (new := [r for r in _status(cluster, keys)["replicas"] if r["replica_id"] not in known]):
        assert _complete(cluster.url, quad, HELD, max_tokens=1).status_code == 200  # both hold HELD: some go there
        assert time.monotonic() < deadline, "no request reached the replacement replica"
    assert ray_cluster.node_of(new[0]["pid"]) is node
    assert f"{HELD}@1" in new[0]["residency"]["cpu"]
