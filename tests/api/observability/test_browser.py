"""The static dashboard in real headless Chromium, against a loopback server with fixed data."""

from __future__ import annotations

import json
import math
import threading
from html.parser import HTMLParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from prometheus_client import CollectorRegistry

from api.observability.dashboard import DASHBOARD_HTML, dashboard_snapshot
from api.observability.drift import DriftConfig, DriftMonitor, DriftSample
from api.observability.history import History
from api.observability.history_buckets import SloPoint
from api.observability.history_json import history_json
from api.observability.labels import LabelBounder
from api.observability.plotly_asset import plotly_js_path
from api.observability.request_metrics import AdmissionCounts, Metrics
from api.observability.slo import DEFAULT_SLO
from tests import browser
from tests.browser import BrowserError, find_chromium, render_page

KEY = "s3cret"
REPO = Path(__file__).resolve().parents[3]
CHARTS = ("ttft", "tpot", "requests", "tokens", "load", "budget", "residency")
needs_chromium = pytest.mark.skipif(find_chromium() is None, reason="Chromium not installed (apt-get install chromium)")


def fixed_data(outcome) -> bytes:
    metrics = Metrics(CollectorRegistry(), 10, lambda tenant: DEFAULT_SLO)
    metrics.observe(outcome(tenant="acme", ttft_seconds=0.25))
    metrics.observe(outcome(tenant="acme", ttft_seconds=2.0, e2e_seconds=2.5))  # misses the 0.5 s TTFT objective
    metrics.observe(outcome(tenant="beta", model="support", version="3", ttft_seconds=0.125))
    drift = DriftMonitor(DriftConfig(drift_reference_requests=4, drift_window_requests=4))
    for prompt in (5, 5, 5, 5, 50, 50, 50, 50):  # prompts ten times longer after the reference window
        drift.record("support", "3", DriftSample(prompt, 4, None, "length", (1, 2, 3, 4)))
    drift.record("sql", "1", DriftSample(5, 4, None, "length", (1, 2, 3, 4)))
    data = dashboard_snapshot(metrics, {"engine": ["support@3"], "cpu": ["support@3", "sql@1"]}, now=0.0,
                              drift=drift.snapshot())
    data["routing"] = {  # the shape of api/routing/serving.py RoutingService.panel
        "rollouts": [{"id": 3, "name": "sql", "policy": "canary", "state": "rolled_back", "percent": 10.0,
                      "reason": "error rate 50% over the last 20 candidate requests is above 20%",
                      "arms": [{"arm": "stable", "model": "sql@1", "requests": 180, "error_rate": 0.0,
                                "ttft_p95_s": 0.25},
                               {"arm": "candidate", "model": "sql@2", "requests": 20, "error_rate": 0.5,
                                "ttft_p95_s": None}],
                      "shadow": {"completed": 4, "exact_match_rate": 0.75}}],
        "breakers": {"sql@2": "open"},
    }
    data["replicas"] = {  # the shape of api/server/dashboard.py Dashboard.data in scale-out mode
        "r-b": {"residency": {"engine": [], "cpu": ["sql@1"]}, "ongoing": 0, "running": 0, "waiting": 0,
                "requests": 7},
        "r-a": {"residency": {"engine": ["support@3", "sql@1"], "cpu": ["support@3", "sql@1"]}, "ongoing": 3,
                "running": 2, "waiting": 1, "requests": 1250},
    }
    data["batches"] = [{"id": "batch_1", "tenant": "acme", "status": "in_progress", "endpoint": "/v1/completions",
                        "total": 40, "finished": 12, "failed": 1}]
    return json.dumps(data).encode()


def fixed_history(outcome, clock) -> History:
    """An hour of made-up traffic: two tenants, two models, every status class, gauges, loads and evictions."""
    clock.now = 1_699_920_000.0 - 3600
    history = History(LabelBounder(10).bound, LabelBounder(10).bound, clock)
    for step in range(360):
        wave = math.sin(step / 25)
        for i in range(4 + step % 5):
            status = 500 if (step + i) % 37 == 0 else 429 if (step + i) % 23 == 0 else 499 if i == 7 else 200
            model, version = ("support", "3") if i % 3 else ("base", "")
            history.record(outcome(tenant="acme" if i % 2 else "beta", model=model, version=version, status=status,
                                   ttft_seconds=0.2 + 0.12 * wave + 0.03 * i, e2e_seconds=1.2 + 0.3 * wave,
                                   completion_tokens=20 + 5 * i))
        budget = max(-0.2, 1 - step / 300)
        history.sample({"acme": AdmissionCounts(int(3 + 3 * wave), 4), "beta": AdmissionCounts(step // 40 % 3, 2)},
                       {"engine": 1 + step // 120, "cpu": 2 + step // 90, "disk": 5},
                       {"all": {"ttft": SloPoint(0.5, budget), "tpot": SloPoint(0.1, 1.0), "e2e": SloPoint(10, 1.0),
                                "availability": SloPoint(None, 1 - step / 900)}})
        if step % 90 == 45:
            history.event("load", f"sql@{step}", "cpu")
        if step % 120 == 100:
            history.event("evict", "support@3", "engine")
        clock.advance(10)
    history.record(outcome(tenant="<i>evil</i>"))  # a name that must stay text in the group picker
    return history


def plotted_points(data: dict, chart: str) -> int:
    """What the page must report as data-points for `chart`: its traces' non-null values (mirrors chartSpecs)."""
    series = {
        "ttft": [data["ttft_s"]["p50"], data["ttft_s"]["p95"], data["objective_s"]["ttft"]],
        "tpot": [data["tpot_s"]["p95"], data["objective_s"]["tpot"]],
        "requests": list(data["requests_per_s"].values()),
        "tokens": [data["output_tokens_per_s"]],
        "load": [data["queued"], data["running"]],
        "budget": list(data["budget_remaining"].values()),
        "residency": [*data["residency"].values(), data["events"]],
    }[chart]
    return sum(1 for s in series for v in s if v is not None)


@pytest.fixture
def server(outcome, clock):
    page, data = DASHBOARD_HTML.read_bytes(), fixed_data(outcome)
    history = fixed_history(outcome, clock)
    plotly_js = plotly_js_path().read_bytes()
    seen_auth: list[str | None] = []
    seen_history: list[dict[str, list[str]]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's naming)
            path, query = urlsplit(self.path).path, parse_qs(urlsplit(self.path).query)
            seen_auth.extend(["URL: " + self.path] if KEY in self.path else [])  # a key in a URL gets logged
            if path in ("/dashboard/data", "/dashboard/history"):
                seen_auth.append(self.headers.get("Authorization"))
            if path == "/dashboard/data":
                ok = self.headers.get("Authorization") == f"Bearer {KEY}"
                self._send(200 if ok else 401, data if ok else b"{}", "application/json")
            elif path == "/dashboard/history":
                seen_history.append(query)
                ok = self.headers.get("Authorization") == f"Bearer {KEY}"
                body = history_json(history, query["resolution"][0], query.get("group", [None])[0], clock.now)
                self._send(200 if ok else 401, json.dumps(body).encode() if ok else b"{}", "application/json")
            elif path == "/dashboard/plotly.min.js":
                self._send(200, plotly_js, "text/javascript")
            elif path == "/dashboard":
                self._send(200, page, "text/html; charset=utf-8")
            else:
                self._send(404, b"", "text/plain")

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", seen_auth, seen_history, history, clock
    httpd.shutdown()
    httpd.server_close()


def _first_bucket(data: dict) -> float:
    """Where the charts start: the window's first bucket, or the one the server started in if it is younger."""
    return next(t for t in data["t"] if t + data["interval_s"] > data["started_at_unix"])


class Dom(HTMLParser):
    """Rows keyed by their data-* attributes, each a map from first CSS class to (all classes, text)."""

    def __init__(self, html: str):
        super().__init__()
        self.rows: dict[tuple[tuple[str, str], ...], dict[str, tuple[set[str], str]]] = {}
        self.ids: dict[str, str] = {}
        self.adapters: dict[str, list[str]] = {}
        self.charts: dict[str, str | None] = {}  # data-chart -> data-points
        self.chart_starts: dict[str, str | None] = {}  # data-chart -> data-x-start (unix s)
        self.groups: list[tuple[str, str, bool]] = []  # select#history-group options: value, text, selected
        self._select: str | None = None
        self._option: list[str] | None = None
        self._row = None
        self._cell: tuple[set[str], list[str]] | None = None
        self._id: tuple[str, list[str]] | None = None
        self._tier: str | None = None
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "tr":
            key = tuple(sorted((k, v) for k, v in attrs.items() if k.startswith("data-")))
            self._row = self.rows.setdefault(key, {}) if key else None
        elif tag == "td" and self._row is not None:
            self._cell = (set((attrs.get("class") or "").split()), [])
            self._row[(attrs.get("class") or "").split()[0]] = self._cell
        elif tag == "ul" and "data-tier" in attrs:
            self._tier = attrs["data-tier"]
            self.adapters[self._tier] = []
        elif tag == "li" and self._tier and "data-adapter" in attrs:
            self.adapters[self._tier].append(attrs["data-adapter"])
        elif tag == "div" and "data-chart" in attrs:
            self.charts[attrs["data-chart"]] = attrs.get("data-points")
            self.chart_starts[attrs["data-chart"]] = attrs.get("data-x-start")
        elif tag == "select":
            self._select = attrs.get("id")
        elif tag == "option" and self._select == "history-group":
            self._option = [attrs["value"], "selected" in attrs]
        if "id" in attrs:
            self._id = (attrs["id"], [])

    def handle_data(self, data):
        if self._option is not None:
            self._option.append(data)
        if self._cell is not None:
            self._cell[1].append(data)
        if self._id is not None:
            self._id[1].append(data)

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None:
            self._cell = None
        if tag == "ul":
            self._tier = None
        if tag == "option" and self._option is not None:
            value, selected, *text = self._option
            self.groups.append((value, "".join(text), selected))
            self._option = None
        if tag == "select":
            self._select = None
        if self._id is not None and tag in ("time", "span", "div"):
            self.ids[self._id[0]] = "".join(self._id[1])
            self._id = None

    def cell(self, row: dict[str, str], cls: str) -> tuple[set[str], str]:
        classes, text = self.rows[tuple(sorted(row.items()))][cls]
        return classes, "".join(text)


@needs_chromium
def test_dashboard_renders_rows_in_chromium(server, tmp_path):
    base, seen_auth, _, _, _ = server
    png = tmp_path / "dashboard.png"
    dom = Dom(render_page(f"{base}/dashboard#key={KEY}", png, wait_ms=3000))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert seen_auth and set(seen_auth) == {f"Bearer {KEY}"}

    acme, beta = {"data-tenant": "acme"}, {"data-tenant": "beta"}
    assert dom.cell(acme, "requests-5m")[1] == "2"
    assert dom.cell(acme, "ttft-p95") == ({"ttft-p95", "missed"}, "2.00 s")
    assert dom.cell(beta, "ttft-p95") == ({"ttft-p95", "met"}, "125.0 ms")
    assert dom.cell(acme, "status")[1] == "missed"
    slo_row = {"data-tenant": "acme", "data-objective": "ttft"}
    assert dom.cell(slo_row, "attainment-1h")[1] == "50.00%"
    assert dom.cell(slo_row, "status") == ({"status", "missed"}, "missed")
    assert dom.cell({"data-model": "support@3"}, "completion-tokens")[1] == "5"
    assert dom.cell({"data-model": "support@3", "data-objective": "availability"}, "status")[1] == "met"
    assert dom.adapters == {"engine": ["support@3"], "cpu": ["sql@1", "support@3"], "disk": []}
    drifted = {"data-drift": "support@3"}
    assert dom.cell(drifted, "psi-prompt_tokens")[0] == {"psi-prompt_tokens", "drifted", "missed"}
    assert float(dom.cell(drifted, "psi-prompt_tokens")[1]) > 0.2
    assert dom.cell(drifted, "psi-output_tokens") == ({"psi-output_tokens"}, "0.000")
    assert dom.cell(drifted, "status")[1] == "drift"
    assert dom.cell({"data-drift": "sql@1"}, "status")[1] == "filling"
    assert dom.ids["drift-threshold"] == "0.2"
    batch = {"data-batch": "batch_1", "data-status": "in_progress"}
    assert (dom.cell(batch, "finished")[1], dom.cell(batch, "failed")[1]) == ("12 / 40", "1")
    assert dom.ids["last-updated"] != "never"
    assert not dom.ids.get("error")
    assert dom.cell({"data-replica": "r-a"}, "requests")[1] == "1,250"
    assert dom.cell({"data-replica": "r-a"}, "engine")[1] == "support@3, sql@1"
    assert dom.cell({"data-replica": "r-b"}, "engine")[1] == "\u2013"
    assert (dom.cell({"data-replica": "r-b"}, "cpu")[1], dom.cell({"data-replica": "r-a"}, "waiting")[1]) == ("sql@1", "1")
    candidate = {"data-rollout": "3", "data-arm": "candidate"}
    assert dom.cell(candidate, "error-rate")[1] == "50.00%"
    assert dom.cell(candidate, "state")[1] == "rolled_back"
    assert dom.cell(candidate, "shadow")[1] == "75.00%"
    assert dom.cell({"data-rollout": "3", "data-arm": "stable"}, "requests")[1] == "180"


@needs_chromium
def test_dashboard_shows_refused_data(server, tmp_path):
    base, *_ = server
    dom = Dom(render_page(f"{base}/dashboard", tmp_path / "refused.png", wait_ms=2000))
    assert "HTTP 401" in dom.ids["error"]
    assert dom.ids["last-updated"] == "never"
    assert not dom.rows
    assert "HTTP 401" in dom.ids["history-error"]
    assert dom.ids["history-updated"] == "never"
    assert set(dom.charts) == set(CHARTS) and not any(dom.charts.values())  # nothing drawn


@needs_chromium
def test_dashboard_draws_every_chart_in_chromium(server, tmp_path):
    base, seen_auth, seen_history, history, clock = server
    png = REPO / "artifacts" / "dashboard-charts.png"  # docs/dashboard.png is a copy of it
    dom = Dom(render_page(f"{base}/dashboard#key={KEY}", png, wait_ms=8000))
    assert set(seen_auth) == {f"Bearer {KEY}"}
    assert seen_history and seen_history[0] == {"resolution": ["10s"], "group": ["all"]}
    assert not dom.ids.get("history-error")
    assert dom.ids["history-updated"] != "never"

    data = history_json(history, "10s", None, clock.now)
    assert set(dom.charts) == set(CHARTS)
    for chart in CHARTS:
        assert dom.charts[chart] is not None, f"chart {chart} was not drawn"
        assert int(dom.charts[chart]) == plotted_points(data, chart) > 0, chart
    assert {float(dom.chart_starts[chart]) for chart in CHARTS} == {_first_bucket(data)}
    assert dom.groups == [("all", "all", True), ("tenant:<i>evil</i>", "tenant: <i>evil</i>", False),
                          ("tenant:acme", "tenant: acme", False), ("tenant:beta", "tenant: beta", False),
                          ("model:base", "model: base", False), ("model:support@3", "model: support@3", False)]


@needs_chromium
def test_charts_of_one_model_by_the_minute(server, tmp_path):
    base, _, seen_history, history, clock = server
    dom = Dom(render_page(f"{base}/dashboard?group=model%3Asupport%403&resolution=1m#key={KEY}",
                          tmp_path / "model.png", wait_ms=8000))
    assert seen_history[0] == {"resolution": ["1m"], "group": ["model:support@3"]}
    data = history_json(history, "1m", "model:support@3", clock.now)
    drawn = {chart: int(points) for chart, points in dom.charts.items() if points is not None}
    assert drawn == {chart: plotted_points(data, chart) for chart in CHARTS}
    assert drawn["load"] == 0 and drawn["requests"] > 0  # admission is per tenant: a model has no queue line
    assert ("model:support@3", "model: support@3", True) in dom.groups
    # The server is younger than the day this view covers: the charts start where its data does.
    assert data["t"][0] < _first_bucket(data)
    assert {float(dom.chart_starts[chart]) for chart in CHARTS} == {_first_bucket(data)}


def test_missing_chromium_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(browser.shutil, "which", lambda name: None)
    with pytest.raises(BrowserError, match="no Chromium found"):
        render_page("http://127.0.0.1:9/", tmp_path / "x.png")


def test_failing_chromium_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(browser, "find_chromium", lambda: "/bin/false")
    with pytest.raises(BrowserError, match="exited with 1"):
        render_page("http://127.0.0.1:9/", tmp_path / "x.png")
