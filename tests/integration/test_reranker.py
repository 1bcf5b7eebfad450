"""The rerank stage with a cross-encoder of the real size and cost: the packaged MiniLM
encoder with a fresh classification head. Its scores are untrained, so these tests check
mechanics, order, deadlines and the service's handling, never ranking quality. The service
answers through the real tiny SGLang."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest

from budget import Deadline
from retrieval.embedder import DEFAULT_EMBEDDER, resolve_model_path
from retrieval.passage import Passage, ScoredPassage
from retrieval.pool import StagePool
from retrieval.rerank.base import RerankerConfig, RerankRequest
from retrieval.rerank.cross_encoder import CrossEncoderReranker
from retrieval.rerank.factory import load_reranker
from retrieval.stages import RerankStage
from tests.integration.conftest import ServiceFactory
from tests.support import post_answer

pytestmark = pytest.mark.integration


@pytest.fixture(scope="session")
def fresh_cross_encoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from sentence_transformers import CrossEncoder

    target = tmp_path_factory.mktemp("cross-encoder")
    CrossEncoder(resolve_model_path(DEFAULT_EMBEDDER), num_labels=1, device="cpu").save(str(target))
    return target


def _candidates(count: int) -> list[ScoredPassage]:
    return [
        ScoredPassage(
            Passage(f"d{i}#0", f"d{i}", 0, f"Title {i}", f"passage text {i} " * 30, 0, 10),
            1.0 - i / 100,
        )
        for i in range(count)
    ]


def test_reranks_candidates_by_cross_encoder_score(fresh_cross_encoder: Path) -> None:
    reranker = CrossEncoderReranker(str(fresh_cross_encoder), RerankerConfig(max_tokens=128))
    reranker.warm_up()
    candidates = _candidates(12)
    top = reranker.rerank(RerankRequest("what is passage 3?", candidates, 5))
    assert len(top) == 5
    scores = [p.score for p in top]
    assert scores == sorted(scores, reverse=True)
    assert {p.passage.passage_id for p in top} <= {c.passage.passage_id for c in candidates}
    again = reranker.rerank(RerankRequest("what is passage 3?", candidates, 5))
    assert [p.passage.passage_id for p in again] == [p.passage.passage_id for p in top]
    assert reranker.rerank(RerankRequest("q", [], 5)) == []


def test_an_unloadable_reranker_is_reported_and_skipped(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    assert load_reranker(RerankerConfig(model=str(tmp_path))) is None
    assert load_reranker(RerankerConfig(model=None)) is None


async def test_rerank_degrades_to_retrieval_order_when_time_runs_out(
    fresh_cross_encoder: Path,
) -> None:
    reranker = CrossEncoderReranker(str(fresh_cross_encoder), RerankerConfig())
    reranker.warm_up()
    pool = StagePool()
    stage = RerankStage(reranker, pool)
    candidates = _candidates(100)
    spent = Deadline.after_ms(1)
    await asyncio.sleep(0.01)
    skipped = await stage.run(RerankRequest("q", candidates, 5), spent)
    assert skipped.cut is not None
    assert skipped.cut.reason == "rerank skipped: deadline already spent"
    assert skipped.value == candidates[:5]
    assert skipped.work is None  # nothing for the planner to learn from
    started = time.perf_counter()
    cut = await stage.run(RerankRequest("q", candidates, 5), Deadline.after_ms(20))
    assert cut.cut is not None
    assert cut.cut.reason == "rerank timed out: retrieval order"
    assert cut.cut.done == 0
    assert cut.value == candidates[:5]
    assert time.perf_counter() - started < 0.5, "the caller is not held past the deadline"
    full = await stage.run(RerankRequest("q", candidates[:10], 5), Deadline.after_ms(30_000))
    assert full.cut is None
    assert full.elapsed_ms > 0
    assert full.work == 10
    pool.close()


def _wait_for_reranker(url: str) -> str:
    deadline = time.monotonic() + 60
    status = ""
    while time.monotonic() < deadline:
        status = httpx.get(f"{url}/readyz").json()["reranker"]
        if not status.startswith(("loading", "not loaded")):
            return status
        time.sleep(0.2)
    raise AssertionError(f"reranker still {status}")


@pytest.mark.sglang
def test_service_reranks_and_reports_the_stage(
    tiny_service: ServiceFactory, fresh_cross_encoder: Path
) -> None:
    with tiny_service(
        reranker_model=str(fresh_cross_encoder),
        planner="off",  # the fixed configuration: it reranks 20 candidates
        default_ttft_budget_ms=20_000,
    ) as url:
        assert _wait_for_reranker(url) == str(fresh_cross_encoder)
        body = post_answer(url, {"query": "Who won Super Bowl 50?", "stream": False}).json()
        done = body["done"]
        assert done["timings_ms"]["rerank"] > 0
        assert done["degraded"] == []
        assert len(body["sources"]) == 5
        trace = httpx.get(f"{url}/v1/traces", params={"limit": 1}).json()[0]
        rerank = next(s for s in trace["spans"] if s["name"] == "rerank")
        assert rerank["attributes"]["rerank.candidates"] == 20
        assert rerank["attributes"]["rerank.top_n"] == 5
        search = next(s for s in trace["spans"] if s["name"] == "search")
        assert search["attributes"]["retrieval.k"] == 20


@pytest.mark.sglang
def test_service_without_a_loadable_reranker_answers_anyway(
    tiny_service: ServiceFactory, tmp_path: Path
) -> None:
    (tmp_path / "config.json").write_text("{}")
    with tiny_service(reranker_model=str(tmp_path)) as url:
        assert _wait_for_reranker(url).startswith("unavailable")
        body = post_answer(url, {"query": "Who won Super Bowl 50?", "stream": False}).json()
        assert body["done"]["timings_ms"]["rerank"] == 0
        assert httpx.get(f"{url}/readyz").status_code == 200


@pytest.mark.sglang
def test_a_reranker_that_attaches_is_timed_here_before_it_is_used(
    tiny_service: ServiceFactory, fresh_cross_encoder: Path
) -> None:
    """The reranker loads after the service is ready; with calibration on, it is timed on this
    machine before requests are sent to it, so rerank depths are priced from what it costs here
    rather than from the 2-core constant."""
    with tiny_service(planner="calibrated", reranker_model=str(fresh_cross_encoder)) as url:
        assert _wait_for_reranker(url) == str(fresh_cross_encoder)
        stages = httpx.get(f"{url}/readyz").json()["calibrated_stages"]
        assert "rerank" in stages
        assert {"embed", "search", "sentences", "prompt"} <= set(stages)
    with tiny_service(reranker_model=str(fresh_cross_encoder)) as url:  # calibration off
        assert _wait_for_reranker(url) == str(fresh_cross_encoder)
        assert httpx.get(f"{url}/readyz").json()["calibrated_stages"] == []
