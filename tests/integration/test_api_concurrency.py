"""Many requests at once through one service and the real tiny SGLang: none lost, none mixed
up."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from answer_service.cli.sse_client import iter_events
from tests.integration.conftest import ServiceFactory

pytestmark = [pytest.mark.integration, pytest.mark.sglang]

QUESTIONS = [
    "Who won Super Bowl 50?",
    "Where is Warsaw?",
    "Who were the Normans?",
    "What is the capital of Poland?",
]


async def _ask(http: httpx.AsyncClient, url: str, query: str) -> list[tuple[str, Any]]:
    async with http.stream("POST", f"{url}/v1/answer", json={"query": query}) as response:
        assert response.status_code == 200
        return [(e.event, e.data) async for e in iter_events(response)]


def test_concurrent_streams_all_complete(tiny_service: ServiceFactory) -> None:
    # A budget every plan fits: this is about no stream lost or mixed up, not admission.
    with tiny_service(default_ttft_budget_ms=60_000) as url:

        async def run() -> list[list[tuple[str, Any]]]:
            async with httpx.AsyncClient(timeout=60) as http:
                return await asyncio.gather(*(_ask(http, url, QUESTIONS[n % 4]) for n in range(24)))

        results = asyncio.run(run())
    assert len(results) == 24
    for events in results:
        names = [name for name, _ in events]
        assert names[:2] == ["plan", "sources"]
        assert names[2] == "token"
        assert set(names[2:-1]) == {"token", "citation"}, names
        assert names[-2:] == ["citation", "done"]
        done = events[-1][1]
        assert done["outcome"] == "ok"
        assert names.count("token") <= done["completion_tokens"]
        # Each stream's citations count along its own text, not another's.
        text = "".join(data["text"] for name, data in events if name == "token")
        assert [data for name, data in events if name == "citation"][-1]["end"] == len(
            text.rstrip()
        )
    trace_ids = {events[-1][1]["trace_id"] for events in results}
    assert len(trace_ids) == 24
