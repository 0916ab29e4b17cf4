"""A loopback OTLP/HTTP collector for tests: keeps what exporters POST to /v1/traces, decoded."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest


class OtlpCollector:
    def __init__(self) -> None:
        self.requests: list[tuple[str, str, bytes]] = []  # (path, content type, body)
        received = self.requests

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's naming)
                body = self.rfile.read(int(self.headers["Content-Length"]))
                received.append((self.path, self.headers["Content-Type"], body))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def spans(self) -> list[tuple[str, object]]:
        """Every span received so far, with its service name: [(service.name, Span)]."""
        found = []
        for _, _, body in list(self.requests):
            for resource_spans in ExportTraceServiceRequest.FromString(body).resource_spans:
                attributes = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
                for scope in resource_spans.scope_spans:
                    found += [(attributes.get("service.name", ""), span) for span in scope.spans]
        return found

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
