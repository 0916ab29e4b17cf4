"""The static dashboard in real headless Chromium, against a loopback server with fixed data."""

from __future__ import annotations

import json
import threading
from html.parser import HTMLParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from prometheus_client import CollectorRegistry

from tests import browser
from tests.browser import BrowserError, find_chromium, render_page
from api.observability.dashboard import DASHBOARD_HTML, dashboard_snapshot
from api.observability.request_metrics import Metrics
from api.observability.slo import DEFAULT_SLO

KEY = "s3cret"
needs_chromium = pytest.mark.skipif(find_chromium() is None, reason="Chromium not installed (apt-get install chromium)")


def fixed_data(outcome) -> bytes:
    metrics = Metrics(CollectorRegistry(), 10, lambda tenant: DEFAULT_SLO)
    metrics.observe(outcome(tenant="acme", ttft_seconds=0.25))
    metrics.observe(outcome(tenant="acme", ttft_seconds=2.0, e2e_seconds=2.5))  # misses the 0.5 s TTFT objective
    metrics.observe(outcome(tenant="beta", model="support", version="3", ttft_seconds=0.125))
    data = dashboard_snapshot(metrics, {"engine": ["support@3"], "cpu": ["support@3", "sql@1"]}, now=0.0)
    return json.dumps(data).encode()


@pytest.fixture
def server(outcome):
    page, data = DASHBOARD_HTML.read_bytes(), fixed_data(outcome)
    seen_auth: list[str | None] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's naming)
            path = self.path.split("?")[0]
            if path == "/dashboard/data":
                seen_auth.append(self.headers.get("Authorization"))
                ok = self.headers.get("Authorization") == f"Bearer {KEY}"
                self._send(200 if ok else 401, data if ok else b"{}", "application/json")
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
    yield f"http://127.0.0.1:{httpd.server_address[1]}", seen_auth
    httpd.shutdown()
    httpd.server_close()


class Dom(HTMLParser):
    """Rows keyed by their data-* attributes, each a map from first CSS class to (all classes, text)."""

    def __init__(self, html: str):
        super().__init__()
        self.rows: dict[tuple[tuple[str, str], ...], dict[str, tuple[set[str], str]]] = {}
        self.ids: dict[str, str] = {}
        self.adapters: dict[str, list[str]] = {}
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
        if "id" in attrs:
            self._id = (attrs["id"], [])

    def handle_data(self, data):
        if self._cell is not None:
            self._cell[1].append(data)
        if self._id is not None:
            self._id[1].append(data)

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None:
            self._cell = None
        if tag == "ul":
            self._tier = None
        if self._id is not None and tag in ("time", "span", "div"):
            self.ids[self._id[0]] = "".join(self._id[1])
            self._id = None

    def cell(self, row: dict[str, str], cls: str) -> tuple[set[str], str]:
        classes, text = self.rows[tuple(sorted(row.items()))][cls]
        return classes, "".join(text)


@needs_chromium
def test_dashboard_renders_rows_in_chromium(server, tmp_path):
    base, seen_auth = server
    png = tmp_path / "dashboard.png"
    dom = Dom(render_page(f"{base}/dashboard?key={KEY}", png, wait_ms=3000))
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
    assert dom.ids["last-updated"] != "never"
    assert not dom.ids.get("error")


@needs_chromium
def test_dashboard_shows_refused_data(server, tmp_path):
    base, _ = server
    dom = Dom(render_page(f"{base}/dashboard", tmp_path / "refused.png", wait_ms=2000))
    assert "HTTP 401" in dom.ids["error"]
    assert dom.ids["last-updated"] == "never"
    assert not dom.rows


def test_missing_chromium_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(browser.shutil, "which", lambda name: None)
    with pytest.raises(BrowserError, match="no Chromium found"):
        render_page("http://127.0.0.1:9/", tmp_path / "x.png")


def test_failing_chromium_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(browser, "find_chromium", lambda: "/bin/false")
    with pytest.raises(BrowserError, match="exited with 1"):
        render_page("http://127.0.0.1:9/", tmp_path / "x.png")
