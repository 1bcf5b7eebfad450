"""The MCP server and its three tools, over any `Service` (the real client or a fake).

`build_server(service, caller_of)`: `caller_of` tells, per call, whose key and which base URL
the call is for (the HTTP mount reads them from the MCP request; the stdio proxy has one fixed
caller). A `ServiceCallError` becomes the SDK's `ToolError`, which the client receives as a
result with `isError` and the service's message; arguments that fail the models of
`tool_values` are refused the same way before any call is made.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

from answer_service.mcp.errors import ServiceCallError
from answer_service.mcp.service_client import Caller, Service
from answer_service.mcp.tool_values import (
    AnswerResult,
    BudgetMs,
    PassageId,
    PassageResult,
    Query,
    SearchFilters,
    SearchResult,
    TopK,
)

SERVER_NAME = "answer-service"
INSTRUCTIONS = (
    "Search a documentation index and answer questions from it with cited sources. `search` "
    "returns ranked passages; `answer` returns an answer whose sentences cite numbered sources; "
    "`get_passage` returns a passage by the id either gave."
)
_READ_ONLY = ToolAnnotations(read_only_hint=True, open_world_hint=False)

CallerOf = Callable[[Context], Caller]
T = TypeVar("T")


async def _tool_call(call: Awaitable[T]) -> T:
    try:
        return await call
    except ServiceCallError as exc:
        raise ToolError(str(exc)) from exc


def build_server(service: Service, caller_of: CallerOf) -> MCPServer[Any]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    server: MCPServer[Any] = MCPServer(SERVER_NAME, instructions=INSTRUCTIONS)
    # The SDK's constructor configures the root logger (`logging.basicConfig` with its own
    # handler) where nothing has yet; logging is the application's to configure.
    root.handlers[:], root.level = handlers, level

    @server.tool(annotations=_READ_ONLY)
    async def search(
        ctx: Context, query: Query, top_k: TopK = 5, filters: SearchFilters | None = None
    ) -> SearchResult:
        """Search the index: the top_k passages for the query (dense, lexical or both, as the
        service is configured), each with its id, title, URL and text."""
        return await _tool_call(service.search(caller_of(ctx), query, top_k, filters))

    @server.tool(annotations=_READ_ONLY)
    async def answer(
        ctx: Context,
        query: Query,
        budget_ms: BudgetMs = None,
        filters: SearchFilters | None = None,
    ) -> AnswerResult:
        """Answer a question from the index within a time budget: the answer with ` [n]` after
        each sentence that source n supports, the numbered sources with their URLs, and a
        citation per sentence. A question the sources do not answer gets 'I do not know'
        (form `abstain`)."""
        return await _tool_call(service.answer(caller_of(ctx), query, budget_ms, filters))

    @server.tool(annotations=_READ_ONLY)
    async def get_passage(ctx: Context, id: PassageId) -> PassageResult:
        """A passage by its id, whole, with its title and URL."""
        return await _tool_call(service.passage(caller_of(ctx), id))

    return server
