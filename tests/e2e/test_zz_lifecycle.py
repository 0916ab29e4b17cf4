"""Operating the real server: dashboard in a real browser, JSON request logs, SIGTERM drain, and
the usage ledger after kill -9. Runs last among the end-to-end tests because it stops the session server."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from api.observability.drift_store import DRIFT_FILE, DriftStore
from tests.conftest import ARTIFACTS, EAGER, ledger_rows
from tests.engine_gate import EngineGate, StreamReader, wait_until


def test_dashboard_in_headless_chromium(server, keys, acme, base_model_id):
    from tests.browser import render_page

    for model in (base_model_id, "sql-helper"):
        httpx.post(f"{server}/v1/completions", headers=acme, timeout=60,
                   json={"model": model, "prompt": "hi", "max_tokens": 4})
    # Gauges (budget, queue, residency) are sampled every 10 s: wait for a sample taken after this traffic.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        history = httpx.get(f"{server}/dashboard/history", headers=keys.admin_headers, timeout=30).json()
        if any(v is not None for v in history["budget_remaining"]["availability"]):
            break
        time.sleep(1)
    png = ARTIFACTS / "dashboard.png"
    dom = render_page(f"{server}/dashboard#key={keys.admin}", png, wait_ms=8000)
    assert png.stat().st_size > 10_000
    assert 'data-tenant="acme"' in dom
    assert 'data-model="' in dom  # adapter-version rows (which ones depends on the metric top-N so far)
    assert 'id="resident-cpu"' in dom and 'data-adapter="' in dom  # adapters resident in the tiers
    # Every chart drew points from the server's own history (the session's traffic so far), not only a frame.
    charts = dict(re.findall(r'data-chart="([a-z]+)"[^>]*data-points="(\d+)"', dom))
    assert set(charts) == {"ttft", "tpot", "requests", "tokens", "load", "budget", "residency"}, charts
    assert all(int(points) > 0 for points in charts.values()), charts


def _log_records(request_id: str) -> list[dict]:
    return [json.loads(line) for line in (ARTIFACTS / "server.log").read_text().splitlines()
            if line.startswith("{") and request_id in line]


def test_one_json_log_line_per_request(server, keys, base_model_id):
    request_id = f"log-{time.time_ns()}"
    response = httpx.post(f"{server}/v1/completions", headers={**keys.headers("obs"), "X-Request-Id": request_id},
                          json={"model": base_model_id, "prompt": "hi", "max_tokens": 3, "ignore_eos": True},
                          timeout=60)
    assert response.status_code == 200
    # The server process writes the line when the request's account closes, which may trail the response.
    deadline = time.monotonic() + 15
    while not _log_records(request_id) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)  # a second line for the same request, if there were one, would come with the first
    lines = _log_records(request_id)
    assert len(lines) == 1
    record = lines[0]
    assert record["request_id"] == request_id and record["tenant"] == "obs" and record["status"] == 200
    assert record["completion_tokens"] == 3


# What the server answered before the restart below: user -> model, and the rollout's id.
BEFORE_RESTART: dict[str, object] = {}


def _ab_models(server: str, acme: dict[str, str]) -> dict[str, str]:
    return {user: httpx.post(f"{server}/v1/completions", headers=acme, timeout=60,
                             json={"model": "route-restart", "prompt": "x", "max_tokens": 1, "user": user}
                             ).json()["model"] for user in (f"user-{i}" for i in range(10))}


def test_routing_state_before_a_restart(server, keys, acme, registry, adapter_dirs):
    for source in ("sql-helper", "support-bot"):
        registry.push(adapter_dirs[source], "route-restart")
    registry.promote("route-restart", 1)
    started = httpx.post(f"{server}/v1/adapters/route-restart/rollout", headers=keys.admin_headers, timeout=30,
                         json={"candidate": 2, "percent": 50, "sticky": True})
    assert started.status_code == 201, started.text
    BEFORE_RESTART.update(rollout=started.json()["id"], models=_ab_models(server, acme))
    assert set(BEFORE_RESTART["models"].values()) == {"route-restart@1", "route-restart@2"}


def test_sigterm_lets_a_running_stream_finish_then_exits_zero(server_process, server, acme, keys, base_model_id,
                                                              demo_home):
    # What the real process must do on SIGTERM: finish the stream it is serving, token for token, and exit 0.
    # Readiness and refusals during the drain are checked where the drain can be held open on purpose
    # (tests/api/test_lifecycle.py). Here the engine is held from before the stream until the server has begun its
    # drain, so the signal lands mid-stream by construction.
    body = {"model": base_model_id, "prompt": "x", "max_tokens": 1000, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    drains_before = server_process.log_path.read_text().count("SIGTERM: draining")
    with EngineGate.of(server_process.proc.pid) as gate:
        for attempt in range(3):
            request_id = f"sigterm-{attempt}-{time.time_ns()}"
            stream = StreamReader(f"{server}/v1/completions", {**acme, "X-Request-Id": request_id}, body)
            gate.pulse_until(lambda: bool(stream.chunks))
            # The server writes a request's ledger row before it stops counting it as in flight, and a held
            # engine cannot finish it meanwhile. Without a real-time pulse timer (tests/engine_gate.py) a pulse
            # woken seconds late can run the whole stream: then it is read to its end and another one is held.
            if not ledger_rows(server, keys, request_id):
                break
            stream.join()
        server_process.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: server_process.log_path.read_text().count("SIGTERM: draining") > drains_before,
                   "the drain began")
    stream.join()
    assert stream.status == 200
    events = [f"data: {event}" for event in stream.events]
    assert events[-1] == "data: [DONE]", "the running stream finished"
    chunks = [json.loads(event[6:]) for event in events[:-1]]
    assert chunks[-1]["usage"]["completion_tokens"] == 1000
    assert [c["finish_reason"] for chunk in chunks for c in chunk["choices"] if c["finish_reason"]] == ["length"]
    assert server_process.proc.wait(60) == 0
    log = server_process.log_path.read_text()
    # At least the stream (earlier modules' queued work, an async job or a batch line, may still be in flight too).
    assert re.search(r"SIGTERM: draining [1-9]\d* request\(s\)", log) and "drain complete" in log
    # The drift windows were saved on the way out, the drained stream's sequence with them (read at the next start).
    saved = DriftStore(demo_home / DRIFT_FILE).load()[(base_model_id, "")]
    assert any(s.output_tokens == 1000 for s in saved.reference + saved.current)
    # Restarts from here on run eagerly: what the tests after this one check (state read back from disk, the ledger
    # across a kill -9) does not depend on the compiled graph, and an eager engine starts sooner.
    server_process.env = {**server_process.env, **EAGER}
    server_process.ensure_running()  # the next test would restart it anyway
    drift = httpx.get(f"{server}/dashboard/data", headers=keys.admin_headers, timeout=30).json()["drift"]
    [restored] = [v for v in drift["versions"] if v["model"] == base_model_id and v["version"] == ""]
    assert (restored["reference"], restored["current"]) == (len(saved.reference), len(saved.current))


def test_routing_state_survives_the_restart(server_process, keys, acme):
    """The SIGTERM test above stopped the server; this start is the restart."""
    assert BEFORE_RESTART, "test_routing_state_before_a_restart did not run"
    server_process.ensure_running()
    server = server_process.url
    report = httpx.get(f"{server}/v1/adapters/route-restart/rollout", headers=keys.admin_headers, timeout=30).json()
    assert report["rollout"]["id"] == BEFORE_RESTART["rollout"] and report["rollout"]["state"] == "active"
    assert sum(arm["requests"] for arm in report["arms"]) == 10  # the outcomes recorded before it
    assert _ab_models(server, acme) == BEFORE_RESTART["models"]  # every user keeps its arm


def test_ledger_survives_kill_9_during_load_and_the_engine_follows(server_process, keys, base_model_id, demo_home):
    """SIGKILL to the server process only (not its group), mid-load: every answered request has its ledger row,
    and vLLM's engine core and workers, which nobody signalled, die after it."""
    from tests.conftest import _alive

    server_process.ensure_running()
    server = server_process.url
    completed: list[str] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        request_id = f"crash-{i}-{time.time_ns()}"
        try:
            response = httpx.post(f"{server}/v1/completions", timeout=120,
                                  headers={**keys.headers("acme"), "X-Request-Id": request_id},
                                  json={"model": base_model_id, "prompt": "x", "max_tokens": 40,
                                        "ignore_eos": True})
        except httpx.HTTPError:
            return
        if response.status_code == 200:
            with lock:
                completed.append(request_id)

    # The engine runs in pulses until 16 answers are in and is held at the kill: the kill lands with requests in
    # flight by construction (a pulse is a few engine steps; a request takes 40). Released, the engine processes
    # find their parent gone (engine/worker/orphan_guard.py).
    with ThreadPoolExecutor(8) as pool, EngineGate.of(server_process.proc.pid) as gate:
        futures = [pool.submit(one, i) for i in range(64)]
        gate.pulse_until(lambda: len(completed) >= 16)
        os.kill(server_process.proc.pid, signal.SIGKILL)
        server_process.proc.wait(timeout=30)
        for f in futures:
            f.result()
    assert 16 <= len(completed) < 64
    ledger = sqlite3.connect(demo_home / "usage.sqlite")
    rows = {r[0]: r[1] for r in ledger.execute("SELECT request_id, status FROM usage WHERE request_id LIKE 'crash-%'")}
    ledger.close()
    assert set(completed) <= set(rows), f"{len(set(completed) - set(rows))} completed responses have no record"
    assert all(rows[r] == 200 for r in completed)
    # A record commits just before its response's last byte, so responses in flight at the kill (at most one
    # per client thread) may have a record the client never saw complete.
    assert 0 <= sum(1 for s in rows.values() if s == 200) - len(completed) <= 8

    deadline = time.monotonic() + 15
    while any(_alive(pid) for pid in gate.pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [pid for pid in gate.pids if _alive(pid)]
    for pid in left:  # do not leave them running for the rest of the session
        os.kill(pid, signal.SIGKILL)
    assert not left, f"engine processes outlived the server by 15 s: {left}"

