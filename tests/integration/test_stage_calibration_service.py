"""The service times its stages where it runs before it is ready, and plans from that: the
calibrated floor shows in /readyz and in every `plan` event, and a budget the shipped (2-core
CPU, SmolLM2) priors would refuse gets a generated answer when this machine and model make it."""

from __future__ import annotations

import pytest

from answer_service.pipeline.planning import PlanningConfig, RequestPlanning
from answer_service.runtime.calibration import calibrated_floor_ms
from tests.integration.conftest import ServiceFactory
from tests.support import parse_sse, post_answer, wait_ready

pytestmark = pytest.mark.integration


def url_of_sglang(ready: dict[str, object]) -> str:
    return str(ready["sglang_url"])


def test_the_floor_is_measured_here_and_plans_follow_it(tiny_service: ServiceFactory) -> None:
    with tiny_service(planner="calibrated") as url:
        ready = wait_ready(url)
        floor = ready["calibrated_floor_ms"]
        shipped = calibrated_floor_ms(RequestPlanning(PlanningConfig(), [url]))
        # A random-weights model with a few layers: far faster than the priors' SmolLM2 on 2 cores.
        assert 0 < floor < shipped
        # Every stage a generated answer goes through was timed here, the prompt layout too.
        assert set(ready["calibrated_stages"]) == {
            "embed",
            "search",
            "sentences",
            "prompt",
            f"first_token@{url_of_sglang(ready)}",
        }
        budget = int((floor + shipped) / 2)
        response = post_answer(
            url, {"query": "Who won Super Bowl 50?", "ttft_budget_ms": budget, "top_k": 3}
        )
        assert response.status_code == 200, response.text
        events = parse_sse(response.text)
        plan = next(e.data for e in events if e.event == "plan")
        assert plan["form"] == "passages"
        assert 0 < plan["floor_ms"] <= budget
        # Its generation slots were measured too (how many depends on what this SGLang
        # batches; the rule itself is tested in tests/unit/test_generation_slots.py).
        slots = ready["generation_slots"]
        assert list(slots) == [url_of_sglang(ready)]
        assert 1 <= slots[url_of_sglang(ready)] <= 16
    with tiny_service(planner="calibrated", generation_slots_per_worker=3) as url:
        # Configured slots stand: nothing is measured.
        assert wait_ready(url)["generation_slots"] == {url_of_sglang(wait_ready(url)): 3}
    with tiny_service() as url:  # the shipped priors: the same budget is under their floor
        assert wait_ready(url)["calibrated_floor_ms"] is None
        assert wait_ready(url)["calibrated_stages"] == []
        refused = post_answer(
            url, {"query": "Who won Super Bowl 50?", "ttft_budget_ms": budget, "top_k": 3}
        )
        assert refused.status_code == 422
        assert "even an idle worker" in refused.json()["error"]["message"]
