"""The service: composes retrieval and generation into the answer pipeline and serves it.

Rooms, with dependencies pointing one way (http -> runtime -> pipeline; cli over all):

- `pipeline/`: a request's plan and stages, citations, the events that flow out (no FastAPI,
  so `eval/` runs it in-process);
- `runtime/`: settings, the components built and warmed in the lifespan, telemetry, metrics,
  Redis, caches, keys, the dashboard's request log;
- `http/`: the FastAPI app, its routes and schemas, the access middleware, the dashboard;
- `mcp/`: the MCP server (tools over the service's own routes), mounted by `http/` at `/mcp`
  and run over stdio by `answer-service mcp`;
- `cli/`: `answer-service` and the demo;
- `errors.py`: the errors the service maps to HTTP answers and SSE `error` events.

May import: `retrieval/`, `generation/`, `budget/` and third-party libraries. Never `eval/`.
"""
