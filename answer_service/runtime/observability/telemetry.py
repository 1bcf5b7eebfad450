"""OpenTelemetry set-up and the in-memory store of recent finished requests.

Every request is a root span with one child span per stage. Finished traces are always kept in
`RecentTraces` (bounded; the dashboard and tests read it) and are also exported over OTLP/HTTP
when an endpoint is configured. Query and passage text never go on spans unless the settings
allow it (`record_content`).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

logger = logging.getLogger(__name__)
SERVICE_NAME = "answer-service"

AttributeValue = str | bool | int | float | tuple[str, ...] | tuple[int, ...] | tuple[float, ...]


@dataclass(frozen=True, slots=True)
class SpanEventRecord:
    name: str
    offset_ms: float
    attributes: dict[str, AttributeValue]


@dataclass(frozen=True, slots=True)
class SpanRecord:
    name: str
    span_id: str
    parent_span_id: str | None
    offset_ms: float
    duration_ms: float
    status: str
    attributes: dict[str, AttributeValue]
    events: tuple[SpanEventRecord, ...]


@dataclass(frozen=True, slots=True)
class TraceRecord:
    """A finished request: its root span first, then its stages in start order."""

    trace_id: str
    started_at_unix_s: float
    spans: tuple[SpanRecord, ...]

    @property
    def root(self) -> SpanRecord:
        return self.spans[0]


def _attributes(raw: Any) -> dict[str, AttributeValue]:
    return {str(key): value for key, value in (raw or {}).items()}


def _record(span: ReadableSpan, origin_ns: int) -> SpanRecord:
    start_ns = span.start_time or origin_ns
    end_ns = span.end_time or start_ns
    return SpanRecord(
        name=span.name,
        span_id=format(span.context.span_id, "016x"),
        parent_span_id=format(span.parent.span_id, "016x") if span.parent else None,
        offset_ms=(start_ns - origin_ns) / 1e6,
        duration_ms=(end_ns - start_ns) / 1e6,
        status=span.status.status_code.name.lower(),
        attributes=_attributes(span.attributes),
        events=tuple(
            SpanEventRecord(
                event.name, (event.timestamp - origin_ns) / 1e6, _attributes(event.attributes)
            )
            for event in span.events
        ),
    )


class RecentTraces(SpanProcessor):
    """Groups finished spans by trace and keeps the last `capacity` finished traces.

    A trace is complete when its root span ends (children of a request end before it). Traces
    whose root never ends are evicted oldest-first beyond `capacity`, so memory stays bounded.
    """

    def __init__(self, capacity: int = 500) -> None:
        self._capacity = capacity
        self._pending: OrderedDict[int, list[ReadableSpan]] = OrderedDict()
        self._finished: deque[TraceRecord] = deque(maxlen=capacity)
        self._lock = threading.Lock()

    def on_end(self, span: ReadableSpan) -> None:
        trace_id = span.context.trace_id
        with self._lock:
            spans = self._pending.setdefault(trace_id, [])
            spans.append(span)
            if span.parent is not None:
                while len(self._pending) > self._capacity:
                    self._pending.popitem(last=False)
                return
            del self._pending[trace_id]
        origin_ns = span.start_time or 0
        children = sorted((s for s in spans if s is not span), key=lambda s: s.start_time or 0)
        record = TraceRecord(
            trace_id=format(trace_id, "032x"),
            started_at_unix_s=origin_ns / 1e9,
            spans=(_record(span, origin_ns), *(_record(s, origin_ns) for s in children)),
        )
        with self._lock:
            self._finished.append(record)

    def recent(
        self, limit: int = 50, where: Callable[[TraceRecord], bool] | None = None
    ) -> list[TraceRecord]:
        """Newest first; only those `where` holds for, if given."""
        with self._lock:
            newest = list(reversed(self._finished))
        if where is not None:
            newest = [trace for trace in newest if where(trace)]
        return newest[:limit]

    def find(self, trace_id: str) -> TraceRecord | None:
        with self._lock:
            return next((t for t in self._finished if t.trace_id == trace_id), None)


def build_tracer_provider(recent: RecentTraces, otlp_endpoint: str | None) -> TracerProvider:
    """Spans kept in `recent` and, with an endpoint, exported over OTLP/HTTP; the resource is
    what OpenTelemetry reads from OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES, named
    `answer-service` where they name no service."""
    resource = Resource.create()
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": SERVICE_NAME}))
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(recent)
    if otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        endpoint = otlp_endpoint.rstrip("/")
        if not endpoint.endswith("/v1/traces"):
            endpoint = f"{endpoint}/v1/traces"
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
        logger.info("otlp export endpoint=%s", endpoint)
    return provider
