"""An OTLP/HTTP trace receiver on loopback for tests: it keeps every span posted to it, decoded."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

SPAN_KIND = {1: "internal", 2: "server", 3: "client"}


@dataclass(frozen=True)
class Span:
    """A span as the receiver decoded it, with its resource's `service.name`."""

    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: str
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    start: int
    end: int
    status: int
    service: str


class Receiver:
    """An OTLP/HTTP trace receiver on 127.0.0.1 keeping every span posted to it, and the paths they
    were posted to. `url` is the base an OTEL_EXPORTER_OTLP_ENDPOINT names; `traces_url` is its
    /v1/traces. Started and stopped as a context manager."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.paths: list[str] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver._keep(self.path, request)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.traces_url = f"{self.url}/v1/traces"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _keep(self, path: str, request: ExportTraceServiceRequest) -> None:
        found = []
        for resource_spans in request.resource_spans:
            service = next((a.value.string_value for a in resource_spans.resource.attributes
                            if a.key == "service.name"), "")  # fmt: skip
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    found.append(Span(
                        span.name, span.trace_id.hex(), span.span_id.hex(), span.parent_span_id.hex(),
                        SPAN_KIND.get(span.kind, str(span.kind)), {a.key: _value(a.value) for a in span.attributes},
                        [(e.name, {a.key: _value(a.value) for a in e.attributes}) for e in span.events],
                        span.start_time_unix_nano, span.end_time_unix_nano, span.status.code, service,
                    ))  # fmt: skip
        with self._lock:
            self.paths.append(path)
            self.spans.extend(found)

    def named(self, prefix: str) -> list[Span]:
        """The spans whose name starts with `prefix`."""
        with self._lock:
            return [span for span in self.spans if span.name.startswith(prefix)]

    def trace(self, trace_id: str) -> list[Span]:
        """The spans of one trace."""
        with self._lock:
            return [span for span in self.spans if span.trace_id == trace_id]

    def __enter__(self) -> Receiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(item) for item in value.array_value.values]
    return getattr(value, kind) if kind else None
