"""What the service runs on: settings, the composition root that builds and warms the
components, telemetry and metrics, Redis and the caches and limits kept there, API keys, the
dashboard's request log, index swaps, the collector's and the event loop's health.

May import: `answer_service.pipeline`, `answer_service.errors`, `budget/`, `retrieval/`,
`generation/`. Never `answer_service.http` or `answer_service.cli`.
"""
