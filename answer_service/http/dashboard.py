"""The latency-budget dashboard: `GET /dashboard` (a page with no outside dependencies), its
static files under `/dashboard/static/`, `GET /dashboard/snapshot` (JSON), and
`GET /dashboard/events` (SSE: a `snapshot` event every `SNAPSHOT_INTERVAL_S`).

A snapshot is computed from the request summaries of the last 15 minutes: every replica's when
the service has a Redis, else (or while Redis is down) this replica's own.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, JSONResponse, StreamingResponse
from fastapi.sse import format_sse_event
from fastapi.staticfiles import StaticFiles

from answer_service.http.answering import ComponentsDep
from answer_service.runtime.components import Components
from answer_service.runtime.observability.dashboard_stats import WINDOWS_S, snapshot

STATIC_DIR = Path(__file__).resolve().parent / "static"
# How often `/dashboard/events` pushes a snapshot: the dashboard's charts move once a second.
SNAPSHOT_INTERVAL_S = 1.0

router = APIRouter(include_in_schema=False)


async def current_snapshot(components: Components) -> dict[str, Any]:
    now = time.time()
    since = now - max(WINDOWS_S)
    if components.shared_requests is not None:
        shared = await components.shared_requests.since(since)
        if shared is not None:
            return snapshot(shared, now=now, source="redis")
    return snapshot(components.request_log.since(since), now=now, source="memory")


@router.get("/dashboard")
async def dashboard() -> FileResponse:
    return FileResponse(STATIC_DIR / "dashboard.html", headers={"Cache-Control": "no-cache"})


@router.get("/dashboard/snapshot")
async def dashboard_snapshot(components: ComponentsDep) -> JSONResponse:
    return JSONResponse(await current_snapshot(components))


@router.get("/dashboard/events")
async def dashboard_events(components: ComponentsDep, http_request: Request) -> StreamingResponse:

    async def snapshots() -> AsyncIterator[bytes]:
        while not await http_request.is_disconnected():
            data = json.dumps(await current_snapshot(components), separators=(",", ":"))
            yield format_sse_event(data_str=data, event="snapshot")
            await asyncio.sleep(SNAPSHOT_INTERVAL_S)

    return StreamingResponse(
        snapshots(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


def mount_static(app: Any) -> None:
    app.mount("/dashboard/static", StaticFiles(directory=STATIC_DIR), name="dashboard-static")
