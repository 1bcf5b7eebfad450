"""The service: composes retrieval and generation into the answer pipeline and serves it.

`pipeline` (no FastAPI, so `eval/` can run it in-process), `api` (FastAPI, SSE), `components`
(built in the lifespan from `settings`), `telemetry` (OpenTelemetry spans and the store of
recent requests), `cli` (`answer-service`) and `demo`.

May import: `retrieval/`, `generation/`, `budget/` and third-party libraries. Never `eval/`.
"""
