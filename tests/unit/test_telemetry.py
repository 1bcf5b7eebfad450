from __future__ import annotations

import pytest
from opentelemetry import trace

from answer_service.runtime.observability.telemetry import RecentTraces, build_tracer_provider


def test_finished_requests_are_grouped_by_trace_newest_first() -> None:
    recent = RecentTraces(capacity=2)
    tracer = build_tracer_provider(recent, None).get_tracer("test")
    for n in range(3):
        with tracer.start_as_current_span("answer", attributes={"n": n}) as root:
            with tracer.start_as_current_span("embed"):
                pass
            with tracer.start_as_current_span("generate") as generate:
                generate.add_event("first_token", {"ttft_ms": 1.5})
            trace_id = format(root.get_span_context().trace_id, "032x")
    records = recent.recent()
    assert len(records) == 2, "capacity bounds the store"
    newest = records[0]
    assert newest.trace_id == trace_id
    assert [s.name for s in newest.spans] == ["answer", "embed", "generate"]
    assert newest.root.attributes["n"] == 2
    assert newest.spans[1].parent_span_id == newest.root.span_id
    assert newest.spans[2].events[0].name == "first_token"
    assert newest.spans[2].events[0].attributes == {"ttft_ms": 1.5}
    assert recent.find(trace_id) is newest


def test_unfinished_traces_do_not_grow_without_bound() -> None:
    recent = RecentTraces(capacity=3)
    tracer = build_tracer_provider(recent, None).get_tracer("test")
    roots = [tracer.start_span("answer") for _ in range(10)]
    for root in roots:
        with trace.use_span(root, end_on_exit=False), tracer.start_as_current_span("embed"):
            pass
    assert len(recent._pending) <= 3
    assert recent.recent() == []


def test_the_service_is_named_by_opentelemetrys_own_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    default = build_tracer_provider(RecentTraces(), None).resource
    assert default.attributes["service.name"] == "answer-service"
    monkeypatch.setenv("OTEL_SERVICE_NAME", "answers-eu")
    named = build_tracer_provider(RecentTraces(), None).resource
    assert named.attributes["service.name"] == "answers-eu"
