"""With OTEL_EXPORTER_OTLP_ENDPOINT set, spans leave the process over OTLP/HTTP (an answer
through the real tiny SGLang)."""

from __future__ import annotations

import time

import pytest
from fastapi import FastAPI, Request, Response
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.integration.conftest import ServiceFactory
from tests.support import post_answer, serve_in_thread

pytestmark = [pytest.mark.integration, pytest.mark.sglang]


def test_spans_are_exported_to_the_configured_collector(
    tiny_service: ServiceFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    received: list[ExportTraceServiceRequest] = []
    collector = FastAPI()

    @collector.post("/v1/traces")
    async def traces(request: Request) -> Response:
        message = ExportTraceServiceRequest()
        message.ParseFromString(await request.body())
        received.append(message)
        return Response(status_code=200)

    with serve_in_thread(collector) as collector_url:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector_url)
        with tiny_service() as url:
            done = post_answer(url, {"query": "Who won Super Bowl 50?", "stream": False})
            trace_id = done.json()["done"]["trace_id"]
        # Leaving the service shuts the tracer provider down, which flushes the batch.
        deadline = time.monotonic() + 10
        while not received and time.monotonic() < deadline:
            time.sleep(0.05)
    spans = [
        span
        for message in received
        for resource_spans in message.resource_spans
        for scope_spans in resource_spans.scope_spans
        for span in scope_spans.spans
        if span.trace_id.hex() == trace_id
    ]
    assert sorted(span.name for span in spans) == [
        "answer",
        "embed",
        "evidence",
        "first_token",
        "form",
        "generate",
        "prompt",
        "search",
        "sentences",
        "slot",
    ]
    service_names = {
        attribute.value.string_value
        for message in received
        for resource_spans in message.resource_spans
        for attribute in resource_spans.resource.attributes
        if attribute.key == "service.name"
    }
    assert service_names == {"answer-service"}
