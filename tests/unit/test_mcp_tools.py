"""The MCP tools' arguments and errors, in-process: the SDK's client against `build_server` over a
fake service that records what reaches it, and `ServiceClient` over httpx's mock transport."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import pytest
from mcp import Client
from mcp.types import CallToolResult, TextContent

from answer_service.mcp.errors import ServiceCallError
from answer_service.mcp.service_client import Caller, ServiceClient
from answer_service.mcp.tool_values import (
    AnswerResult,
    PassageResult,
    SearchFilters,
    SearchResult,
)
from answer_service.mcp.tools import build_server

CALLER = Caller(base_url="http://answers.example", headers={"authorization": "Bearer k"})


class FakeService:
    """Honours `Service`; records each call, or raises `refuse` when set."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.refuse: ServiceCallError | None = None

    def _record(self, name: str, *args: Any) -> None:
        if self.refuse is not None:
            raise self.refuse
        self.calls.append((name, args))

    async def search(
        self, caller: Caller, query: str, top_k: int, filters: SearchFilters | None
    ) -> SearchResult:
        self._record("search", query, top_k, filters)
        return SearchResult(mode="hybrid", passages=[])

    async def answer(
        self, caller: Caller, query: str, budget_ms: int | None, filters: SearchFilters | None
    ) -> AnswerResult:
        self._record("answer", query, budget_ms, filters)
        return AnswerResult(
            answer="Yes. [1]",
            sources=[],
            citations=[],
            form="quote",
            ttft_ms=3.0,
            within_budget=True,
            trace_id="t",
        )

    async def passage(self, caller: Caller, passage_id: str) -> PassageResult:
        self._record("passage", passage_id)
        return PassageResult(id=passage_id, doc_id="d", title="T", url="u", text="x")


@pytest.fixture
def fake() -> FakeService:
    return FakeService()


async def _call(fake: FakeService, tool: str, arguments: dict[str, Any]) -> CallToolResult:
    async with Client(build_server(fake, lambda _ctx: CALLER)) as client:
        return await client.call_tool(tool, arguments)


def _error_text(result: CallToolResult) -> str:
    assert result.is_error
    (content,) = result.content
    assert isinstance(content, TextContent)
    return content.text


async def test_valid_arguments_reach_the_service_with_defaults(fake: FakeService) -> None:
    assert not (await _call(fake, "search", {"query": "vacuum"})).is_error
    filters = {"collection": ["a", "b"], "path_prefix": "a/ops/", "tags": ["t"]}
    await _call(fake, "search", {"query": "vacuum", "top_k": 7, "filters": filters})
    await _call(fake, "answer", {"query": "why?", "budget_ms": 1500})
    await _call(fake, "get_passage", {"id": "a/x.md#2"})
    assert fake.calls[0] == ("search", ("vacuum", 5, None))
    name, (_, top_k, given) = fake.calls[1]
    assert (name, top_k) == ("search", 7)
    assert given.body() == filters
    assert fake.calls[2] == ("answer", ("why?", 1500, None))
    assert fake.calls[3] == ("passage", ("a/x.md#2",))


@pytest.mark.parametrize(
    ("tool", "arguments", "field"),
    [
        ("search", {}, "query"),
        ("search", {"query": ""}, "query"),
        ("search", {"query": 5}, "query"),
        ("search", {"query": "q", "top_k": 0}, "top_k"),
        ("search", {"query": "q", "top_k": "many"}, "top_k"),
        ("search", {"query": "q", "filters": {"collection": []}}, "filters"),
        ("search", {"query": "q", "filters": {"collection": ""}}, "filters"),
        ("search", {"query": "q", "filters": {"tags": "ops"}}, "filters"),
        ("search", {"query": "q", "filters": {"path_prefix": ""}}, "filters"),
        ("search", {"query": "q", "filters": {"colection": "a"}}, "filters"),
        ("search", {"query": "q", "filters": "a"}, "filters"),
        ("answer", {"query": "q", "budget_ms": 0}, "budget_ms"),
        ("answer", {"query": "q", "budget_ms": -5}, "budget_ms"),
        ("answer", {"query": "x" * 100_001}, "query"),
        ("get_passage", {}, "id"),
        ("get_passage", {"id": ""}, "id"),
    ],
)
async def test_bad_arguments_are_a_tool_error_naming_the_field(
    fake: FakeService, tool: str, arguments: dict[str, Any], field: str
) -> None:
    text = _error_text(await _call(fake, tool, arguments))
    assert "validation error" in text
    assert field in text
    assert fake.calls == []


async def test_a_service_refusal_is_a_tool_error_with_its_message(fake: FakeService) -> None:
    fake.refuse = ServiceCallError("key 'a' is over its rate", status=429, code="rate_limited")
    text = _error_text(await _call(fake, "answer", {"query": "q"}))
    assert text.endswith("429 rate_limited: key 'a' is over its rate")


def _client(handler: Any) -> ServiceClient:
    http = httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://svc")
    return ServiceClient(http)


async def test_the_client_maps_the_service_s_error_body_and_retry_after() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        assert request.headers["authorization"] == "Bearer k"
        body = {"error": {"code": "rate_limited", "message": "over its rate"}}
        return httpx.Response(429, json=body, headers={"retry-after": "2"})

    with pytest.raises(ServiceCallError) as raised:
        await _client(refuse).search(CALLER, "q", 3, None)
    assert str(raised.value) == "429 rate_limited: over its rate (retry after 2 s)"
    assert (raised.value.status, raised.value.code) == (429, "rate_limited")


async def test_the_client_reports_a_non_json_failure_and_an_unreachable_service() -> None:
    with pytest.raises(ServiceCallError, match="502 error: bad gateway"):
        await _client(lambda _: httpx.Response(502, text="bad gateway")).passage(CALLER, "a#0")

    def unreachable(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    with pytest.raises(ServiceCallError, match="cannot reach the service") as raised:
        await _client(unreachable).answer(CALLER, "q", None, None)
    assert raised.value.status is None


async def test_the_client_sends_the_service_s_bodies_and_links_each_passage() -> None:
    seen: list[httpx.Request] = []

    def route(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        passage = {"id": "a/x.md#0", "doc_id": "a/x.md", "title": "X", "score": 1.0, "text": "t"}
        return httpx.Response(200, json={"mode": "lexical", "passages": [passage]})

    filters = SearchFilters(collection="a")
    found = await _client(route).search(CALLER, "q", 4, filters)
    assert seen[0].url.path == "/v1/retrieve"
    body = seen[0].read().decode()
    assert '"top_k":4' in body.replace(" ", "")
    assert '"filters":{"collection":"a"}' in body.replace(" ", "")
    # No section URL in the index: the service's own passage URL, at the caller's base URL.
    assert found.passages[0].url == "http://answers.example/v1/passages/a%2Fx.md%230"


def test_building_the_server_leaves_an_unconfigured_root_logger_alone() -> None:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    root.handlers.clear()  # as in a process that has not configured logging
    try:
        build_server(FakeService(), lambda _ctx: CALLER)
        assert (root.handlers, root.level) == ([], level)
    finally:
        root.handlers[:] = handlers
