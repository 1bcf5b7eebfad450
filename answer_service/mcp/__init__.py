"""The MCP server: the service's search, answers and passages as Model Context Protocol tools
(`search`, `answer`, `get_passage`), built on the protocol's official SDK (docs/mcp.md).

Two ways in, one set of tools:

- `http_mount`: Streamable HTTP at `/mcp` on the service's own app (stateless, JSON
  responses); each tool calls the app's own routes in-process, forwarding the caller's key;
- `stdio_proxy`: `answer-service mcp --url URL` for desktop clients, the same tools calling a
  running service over HTTP.

Either way a tool is a client of `/v1/retrieve`, `/v1/answer` and `/v1/passages/{id}`, so the
same keys, tiers, rate limits and collections apply as to any other client.

May import: `answer_service.errors` and third-party libraries (the SDK, httpx, pydantic). It
talks to the service over HTTP only, so it imports nothing of `http/`, `runtime/` or
`pipeline/`; `http/api.py` mounts it.
"""
