"""OpenTelemetry traces, switched on by the standard OTEL_* variables, and the trace context that
crosses Quicksave's own hops.

With OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, or OTEL_TRACES_EXPORTER=otlp)
set and OTEL_SDK_DISABLED not true, every process (web, worker, management command) exports spans
over OTLP/HTTP: Django's requests, psycopg's statements, Redis commands and httpx calls through
their instrumentations, named by OTEL_SERVICE_NAME and sampled by OTEL_TRACES_SAMPLER. The
exporter reads its own variables (headers, timeout, compression).

Three hops have no instrumentation, so Quicksave carries the W3C trace context itself:
a committed event to the publisher thread and through the channel layer to the socket that
pushes it (checkpoints.live, checkpoints.sockets), and a queued run to the worker or agent that resumes it
(`Run.trace_context`). Without tracing every helper here is a no-op that allocates nothing.

Database and Redis calls made outside any request or run (the channel layer's polling, lease
heartbeats, the metrics collector) are not sampled: each would be a trace of its own.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    Decision,
    ParentBased,
    Sampler,
    SamplingResult,
    TraceIdRatioBased,
)
from opentelemetry.trace import Link, SpanKind
from opentelemetry.util.types import Attributes

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace.export import SpanExporter

from quicksave.env import ConfigError, envbool, envstr

log = logging.getLogger(__name__)

_tracer = trace.get_tracer("quicksave")
_lock = threading.Lock()
_enabled = False


def requested() -> bool:
    """Whether the environment asks for traces (the OTEL_* variables an operator sets)."""
    if envbool("OTEL_SDK_DISABLED", False):
        return False
    exporter = envstr("OTEL_TRACES_EXPORTER").strip().lower()
    if exporter == "none":
        return False
    return bool(
        exporter == "otlp" or envstr("OTEL_EXPORTER_OTLP_ENDPOINT") or envstr("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def enabled() -> bool:
    return _enabled


def configure() -> bool:
    """Install the tracer provider and the Django, psycopg, Redis and httpx instrumentations, once
    per process, when the environment asks for traces; True when tracing is on. Called from
    QuicksaveConfig.ready(), before Django builds its middleware chain."""
    global _enabled
    if not requested():
        return False
    with _lock:
        if _enabled:
            return True
        # Imported here: a process without tracing loads none of the SDK's exporter machinery.
        from opentelemetry.instrumentation.django import DjangoInstrumentor
        from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
        from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
        from opentelemetry.instrumentation.redis import RedisInstrumentor
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        provider = TracerProvider(resource=resource(), sampler=NoOrphanClientSpans(sampler_from_env()))
        provider.add_span_processor(BatchSpanProcessor(span_exporter()))
        trace.set_tracer_provider(provider)
        DjangoInstrumentor().instrument(tracer_provider=provider)
        PsycopgInstrumentor().instrument(tracer_provider=provider)
        RedisInstrumentor().instrument(tracer_provider=provider)
        HTTPXClientInstrumentor().instrument(tracer_provider=provider)
        _enabled = True
    log.info("tracing on: spans go to %s", _endpoint())
    return True


def resource() -> Resource:
    """The resource Quicksave's spans name: OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES, with
    `quicksave` as the service's name when the environment gives none."""
    from opentelemetry.sdk.resources import Resource

    found = Resource.create()
    if str(found.attributes.get("service.name", "")).startswith("unknown_service"):
        found = found.merge(Resource({"service.name": "quicksave"}))  # OTEL_SERVICE_NAME unset
    return found


def span_exporter(endpoint: str | None = None, *, timeout: float | None = None) -> SpanExporter:
    """The OTLP/HTTP exporter, to `endpoint` (a full URL, e.g. http://collector:4318/v1/traces) or,
    without one, where the OTEL_EXPORTER_OTLP_* variables say; its headers and compression come
    from those variables either way."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=endpoint or None, timeout=timeout)


def shutdown() -> None:
    """Export the spans still queued (a worker or server that is stopping calls it)."""
    provider = trace.get_tracer_provider()
    flush = getattr(provider, "shutdown", None)
    if _enabled and callable(flush):
        flush()


def _endpoint() -> str:
    return envstr("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or envstr("OTEL_EXPORTER_OTLP_ENDPOINT") or "the default"


def sampler_from_env() -> Sampler:
    """OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG, as the specification names them."""
    name = envstr("OTEL_TRACES_SAMPLER", "parentbased_always_on").strip().lower()
    arg = envstr("OTEL_TRACES_SAMPLER_ARG", "1.0")
    try:
        ratio = float(arg)
    except ValueError:
        raise ConfigError(f"OTEL_TRACES_SAMPLER_ARG must be a number from 0 to 1, got {arg!r}") from None
    samplers: dict[str, Sampler] = {
        "always_on": ALWAYS_ON,
        "always_off": ALWAYS_OFF,
        "traceidratio": TraceIdRatioBased(ratio),
        "parentbased_always_on": ParentBased(ALWAYS_ON),
        "parentbased_always_off": ParentBased(ALWAYS_OFF),
        "parentbased_traceidratio": ParentBased(TraceIdRatioBased(ratio)),
    }
    if name not in samplers:
        raise ConfigError(f"OTEL_TRACES_SAMPLER must be one of {', '.join(samplers)}, got {name!r}")
    return samplers[name]


class NoOrphanClientSpans(Sampler):
    """Drops a database or Redis call (a CLIENT span) that no request or run started; asks
    `delegate` about every other span."""

    def __init__(self, delegate: Sampler) -> None:
        self.delegate = delegate

    def should_sample(
        self,
        parent_context: otel_context.Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: Any = None,
    ) -> SamplingResult:
        parent = trace.get_current_span(parent_context).get_span_context()
        if kind == SpanKind.CLIENT and not parent.is_valid:
            return SamplingResult(Decision.DROP)
        return self.delegate.should_sample(parent_context, trace_id, name, kind, attributes, links, trace_state)

    def get_description(self) -> str:
        return f"NoOrphanClientSpans{{{self.delegate.get_description()}}}"


def current_carrier() -> dict[str, str]:
    """The current trace context as W3C headers (`traceparent`, `tracestate`), to hand to another
    thread or process; empty without tracing or outside a span."""
    if not _enabled:
        return {}
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


@contextlib.contextmanager
def span(
    name: str,
    *,
    carrier: Mapping[str, str] | None = None,
    links: Sequence[Mapping[str, str]] = (),
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: Mapping[str, str | int | float | bool] | None = None,
) -> Iterator[None]:
    """A span around the block, the child of the context in `carrier` (from current_carrier in
    another thread or process) when there is one, linked to the contexts in `links`."""
    if not _enabled:
        yield
        return
    parent = propagate.extract(carrier) if carrier else None
    span_links = [Link(ctx) for ctx in (_span_context(c) for c in links) if ctx is not None]
    with _tracer.start_as_current_span(name, context=parent, kind=kind, links=span_links, attributes=attributes):
        yield


def _span_context(carrier: Mapping[str, str]) -> trace.SpanContext | None:
    ctx = trace.get_current_span(propagate.extract(carrier)).get_span_context()
    return ctx if ctx.is_valid else None


def ids() -> tuple[str, str] | None:
    """The current trace and span ids in hex (for log lines), or None outside a sampled span."""
    if not _enabled:
        return None
    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return None
    return format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")


__all__ = [
    "configure",
    "current_carrier",
    "enabled",
    "ids",
    "requested",
    "resource",
    "sampler_from_env",
    "shutdown",
    "span",
    "span_exporter",
]
