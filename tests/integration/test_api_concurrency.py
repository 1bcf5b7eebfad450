"""Many requests at once through one service: none lost, none mixed up."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from answer_service.cli.sse_client import iter_events
from tests.fakes.fake_sglang import FakeSGLangState, create_fake_sglang
from tests.integration.conftest import ServiceFactory
from tests.support import serve_in_thread

pytestmark = pytest.mark.integration

QUESTIONS = [
    "Who won Super Bowl 50?",
    "Where is Warsaw?",
    "Who were the Normans?",
    "What is the capital of Poland?",
]


async def _ask(http: httpx.AsyncClient, url: str, query: str) -> list[str]:
    async with http.stream("POST", f"{url}/v1/answer", json={"query": query}) as response:
        assert response.status_code == 200
        return [f"{e.event}:{e.data.get('trace_id', '')}" async for e in iter_events(response)]


def test_concurrent_streams_all_complete(
    service: ServiceFactory, chatml_tokenizer_dir: Path
) -> None:
    state = FakeSGLangState(model_path=str(chatml_tokenizer_dir), token_delay_s=0.05)
    with (
        serve_in_thread(create_fake_sglang(state)) as sglang_url,
        # A budget every plan fits: this is about no stream lost or mixed up, not admission.
        service(sglang_url=sglang_url, default_ttft_budget_ms=60_000) as url,
    ):

        async def run() -> list[list[str]]:
            async with httpx.AsyncClient(timeout=60) as http:
                return await asyncio.gather(*(_ask(http, url, QUESTIONS[n % 4]) for n in range(24)))

        results = asyncio.run(run())
    assert len(results) == 24
    for events in results:
        assert events[:2] == ["plan:", "sources:"]
        assert [e.split(":")[0] for e in events[2:-1]] == ["token"] * 5 + ["citation"]
        assert events[-1].startswith("done:")
    trace_ids = {events[-1] for events in results}
    assert len(trace_ids) == 24
    assert len({request["rid"] for request in state.requests}) == 24
    assert state.aborted == []
