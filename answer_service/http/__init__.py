"""The HTTP edge: the FastAPI app and its routes (`POST /v1/answer`, the OpenAI-compatible
APIs (chat completions and responses), retrieval, passages, health, metrics, traces, the
dashboard, the search page at `/`, the MCP server mounted at `/mcp`), request bodies and SSE
payloads, and the access middleware (API keys, rate limits, body size).

May import: `answer_service.pipeline`, `answer_service.runtime`, `answer_service.mcp` (to mount
it), `answer_service.errors`, and the packages below them. The only room that imports FastAPI.
"""
