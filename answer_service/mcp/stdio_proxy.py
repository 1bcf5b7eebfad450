"""`answer-service mcp --url URL`: the same tools over stdio, for desktop clients that start
an MCP server as a subprocess. A thin client of a running service: each tool calls URL's
`/v1/` routes with the key given (`--api-key` or `ANSWER_API_KEY`), so that key's tier, limits
and collections apply. Nothing but the protocol goes to stdout; logs go to stderr.
"""

from __future__ import annotations

import httpx

from answer_service.mcp.service_client import Caller, ServiceClient
from answer_service.mcp.tools import build_server


async def serve_stdio(url: str, api_key: str | None) -> None:
    base = url.rstrip("/")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    caller = Caller(base_url=base)
    # The key rides on the client; per-call timeouts come from ServiceClient.
    async with httpx.AsyncClient(base_url=base, headers=headers) as http:
        server = build_server(ServiceClient(http), lambda _ctx: caller)
        await server.run_stdio_async()
