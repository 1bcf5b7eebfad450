"""`/mcp` on the service's own app: Streamable HTTP, stateless. A call that finishes within the
SDK's 15 s window is answered with one JSON response; a longer one as an event stream with
pings, so that proxies do not close it as idle.

The tools call the app's routes in-process, through an `httpx.ASGITransport` over the whole
app (access middleware included), with the MCP request's key headers: the key is checked, rate
limited and counted once, on the `/v1/` route the tool calls (the access middleware only
authenticates `/mcp` itself, so a request without a valid key gets 401 before any MCP message).

The SDK's session manager needs a task group that lives as long as the app: FastAPI does not
run a mounted app's lifespan, so the app's own lifespan enters `McpMount.running()`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
from mcp.server.mcpserver import Context
from mcp.server.transport_security import TransportSecuritySettings
from starlette.applications import Starlette
from starlette.requests import Request

from answer_service.mcp.service_client import Caller, ServiceClient
from answer_service.mcp.tools import build_server

MCP_PATH = "/mcp"
# What a tool call passes on to the routes it calls: the key, the tier asked for, the trace.
FORWARDED_HEADERS = ("authorization", "x-api-key", "x-tenant-tier", "traceparent")
# The in-process base URL; never seen outside (passage URLs use the caller's own base URL).
_INTERNAL_BASE = "http://answer-service.internal"


def _caller(ctx: Context) -> Caller:
    request = ctx.request_context.request
    headers = ctx.headers or {}
    forwarded = {name: headers[name] for name in FORWARDED_HEADERS if name in headers}
    base = str(request.base_url) if isinstance(request, Request) else _INTERNAL_BASE
    return Caller(base_url=base, headers=forwarded)


class McpMount:
    """The MCP server on `app` at `/mcp`; `running()` belongs in the app's lifespan."""

    def __init__(self, app: Starlette) -> None:
        # No network: the transport calls the app in this process. Closed in `running()`.
        self._http = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url=_INTERNAL_BASE
        )
        self._server = build_server(ServiceClient(self._http), _caller)
        routes = self._server.streamable_http_app(
            streamable_http_path=MCP_PATH,
            stateless_http=True,
            # Not the SDK's JSON-only mode: that one runs the tool without watching the
            # connection, so an answer whose client went away ran on to its deadline; this mode
            # cancels the tool (and so the in-process /v1/answer, which aborts SGLang) and still
            # answers a call that finishes in time with plain JSON.
            json_response=False,
            # The SDK would allow only localhost Host headers (DNS-rebinding protection for
            # local servers); the service is deployed under its own names, and /mcp reaches
            # nothing the /v1/ routes beside it do not already serve under the same keys.
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        ).routes
        # The route itself, not a Mount: a Mount answers `POST /mcp` with a redirect to `/mcp/`.
        app.router.routes.extend(routes)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        try:
            async with self._server.session_manager.run():
                yield
        finally:
            await self._http.aclose()
