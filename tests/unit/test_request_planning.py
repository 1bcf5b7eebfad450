"""The planner as the service runs it: the plan at arrival, admission, slices and cuts."""

from __future__ import annotations

import pytest

from answer_service.pipeline.planning import PlanningConfig, RequestPlanning
from budget import CacheEstimator
from budget.planner import QualityCurve
from budget.stage import StageCut, StageResult

W = "http://worker"


def planning(**config: object) -> RequestPlanning:
    return RequestPlanning(PlanningConfig(**config), [W])  # type: ignore[arg-type]


def test_an_idle_worker_and_a_roomy_budget_get_every_passage() -> None:
    tracker = planning().start("who won?", 5, 10_000, 10_000, "standard", False, CacheEstimator())
    assert tracker.plan.fits
    assert tracker.knobs.passages == 5
    assert tracker.planner


async def test_a_long_queue_makes_the_request_not_fit() -> None:
    p = planning()
    cache = CacheEstimator()
    idle = p.start("q", 5, 3_000, 3_000, "standard", False, cache)
    assert idle.plan.fits
    held = await p.gate.acquire(W, "standard", 20_000)  # ~38 s of prefill ahead
    busy = p.start("q", 5, 3_000, 3_000, "standard", False, cache)
    assert not busy.plan.fits
    assert not busy.plan.likely
    assert busy.knobs.passages == 1  # the smallest plan, for the refusal message
    assert p.retry_after_s() >= 30
    held.release()
    assert p.retry_after_s() == 1


def test_planner_off_fixes_the_knobs_whatever_the_budget() -> None:
    p = planning(enabled=False, fixed_rerank_depth=15)
    tracker = p.start("q", 4, 10, 10, "standard", True, CacheEstimator())
    assert not tracker.planner
    assert (tracker.knobs.rerank_depth, tracker.knobs.passages) == (15, 4)
    assert not tracker.plan.fits  # predicted and recorded all the same
    no_reranker = p.start("q", 4, 10, 10, "standard", False, CacheEstimator())
    assert no_reranker.knobs.rerank_depth == 0


def test_slices_share_out_the_spare_time_and_cuts_change_the_knobs() -> None:
    tracker = planning().start("q", 3, 20_000, 20_000, "premium", False, CacheEstimator())
    predicted = tracker.plan.predicted_ms
    whole = tracker.slice_ms("embed", "search", "rerank", "sentences", "prompt", "first_token")
    assert whole == pytest.approx(tracker.plan.available_ms)
    assert tracker.slice_ms("embed") == pytest.approx(
        predicted.embed * tracker.plan.available_ms / predicted.total
    )
    tracker = tracker.after("embed", StageResult(None, 12.0))
    tracker = tracker.after("search", StageResult(None, 3.0))
    tracker = tracker.after(
        "prompt", StageResult(None, 2.0, cut=StageCut("first token predicted late", 1))
    )
    record = tracker.record(planning().config.quality)
    assert record.knobs.passages == 1
    assert record.initial.passages == 3
    assert record.actual_ms.embed == 12.0
    assert record.cuts[0].planned == 3
    assert record.cuts[0].done == 1
    assert record.quality == pytest.approx(0.718)
    assert record.tier == "premium"


class _Fleet:
    def __init__(self, rate: float | None) -> None:
        self.rate = rate
        self.marks = 0

    def mark(self) -> None:
        self.marks += 1

    def per_second(self) -> float | None:
        return self.rate


def test_the_fleets_arrival_rate_per_worker_shrinks_the_plan() -> None:
    alone = planning()
    busy_fleet = _Fleet(rate=6.0)  # the other replicas send 6 requests/s to 2 workers
    shared = RequestPlanning(PlanningConfig(fleet_workers=2), [W], busy_fleet)
    assert shared.arrival_rate_rps() == 3.0
    cache = CacheEstimator()
    mine = alone.start("q", 5, 10_000, 10_000, "standard", False, cache)
    theirs = shared.start("q", 5, 10_000, 10_000, "standard", False, cache)
    assert busy_fleet.marks == 1  # this arrival counts for the fleet too
    # The prefill-utilisation cap: 3 requests/s per worker leaves room for short prefills only.
    assert theirs.knobs.passages < mine.knobs.passages
    busy_fleet.rate = None  # Redis down or stale: this replica's own rate
    assert shared.arrival_rate_rps() == shared.arrivals.per_second()  # one worker here


async def test_behind_a_queue_admission_predicts_at_its_own_quantile() -> None:
    cache = CacheEstimator()
    strict, lenient = planning(), planning(admit_quantile=0.5)
    # A short queue: the median makes 3 s, the p90 does not.
    held = [await p.gate.acquire(W, "standard", 850) for p in (strict, lenient)]
    refused = strict.start("q", 5, 3_000, 3_000, "standard", False, cache)
    admitted = lenient.start("q", 5, 3_000, 3_000, "standard", False, cache)
    # The same plan, chosen on the p90 (the smallest: no plan fits with its margins) ...
    assert refused.knobs == admitted.knobs
    assert refused.knobs.passages == 1
    assert not refused.plan.fits
    assert not admitted.plan.fits
    # ... admitted on the median with the margins, not on the p90.
    assert not refused.admitted
    assert admitted.admitted
    assert admitted.plan.admissible
    # A long queue is refused at either quantile.
    for p, slot in zip((strict, lenient), held, strict=True):
        slot.release()
        await p.gate.acquire(W, "standard", 20_000)
    assert not lenient.start("q", 5, 3_000, 3_000, "standard", False, cache).admitted


def test_a_cut_reader_changes_no_knob() -> None:
    tracker = planning().start("q", 3, 20_000, 20_000, "standard", False, CacheEstimator())
    cut = tracker.after(
        "read", StageResult([], 0.1, cut=StageCut("read skipped: 10 ms left, ~60 ms needed", 0))
    )
    assert (cut.knobs.passages, cut.knobs.rerank_depth) == (
        tracker.knobs.passages,
        tracker.knobs.rerank_depth,
    )
    assert [(c.stage, c.reason) for c in cut.cuts] == [
        ("read", "read skipped: 10 ms left, ~60 ms needed")
    ]


async def test_a_quote_is_planned_as_one_and_buys_rerank_depth() -> None:
    deeper = QualityCurve({0: (0.70, 0.85), 10: (0.75, 0.88), 20: (0.80, 0.90)})
    cache = CacheEstimator()
    quote = planning(quality=deeper).start(
        "q", 5, 3_000, 3_000, "standard", True, cache, mode="quote"
    )
    assert quote.admit("quote", 5, False).route == "model"  # admitted: the forms step quotes
    assert quote.knobs.rerank_depth == 20
    assert quote.plan.predicted_ms.first_token == 0.0
    # No generation makes the budget behind a long queue: under auto the request is quoted,
    # at the depth the quote's own plan bought rather than none; sources only get none.
    p = planning(quality=deeper)
    await p.gate.acquire(W, "standard", 20_000)
    busy = p.start("q", 5, 3_000, 3_000, "standard", True, cache)
    assert not busy.admitted
    quoted = busy.admit("auto", 5, True)
    assert quoted.route == "quote"
    assert (quoted.knobs.rerank_depth, quoted.knobs.passages) == (20, 5)
    assert quoted.plan.predicted_ms.first_token == 0.0
    sources = busy.admit("passages", 5, True)
    assert sources.route == "sources_only"
    assert sources.knobs.rerank_depth == 0
    # Arrivals close behind each other: the reranks would take the CPU, so shallower ones.
    again = p.start("q", 5, 3_000, 3_000, "standard", True, cache).admit("auto", 5, True)
    assert p.arrivals.per_second() >= 1.0
    assert 0 < again.knobs.rerank_depth < 20
    # A budget that holds the quote's search but not its rerank: the quote reranks nothing.
    tight = planning(quality=deeper).start("q", 5, 150, 150, "standard", True, cache)
    admitted = tight.admit("auto", 5, True)
    assert (admitted.route, admitted.knobs.rerank_depth) == ("quote", 0)


def test_a_prompt_is_sent_ahead_only_where_its_form_is_known_and_a_slot_is_free() -> None:
    p = planning()
    cache = CacheEstimator()
    for mode, ahead, sends in (
        ("passages", 0.0, True),
        ("passages", 0.5, False),  # behind a queue: the overlap gains nothing
        ("auto", 0.0, False),  # the form is chosen after the evidence
        ("focused", 0.0, False),  # made of the sentences it would overlap
        ("quote", 0.0, False),
    ):
        plan = p.start("q", 3, 20_000, 20_000, "standard", False, cache).admit(mode, 3, False)
        assert plan.sends_ahead(ahead) is sends, (mode, ahead)


def test_a_plan_joined_with_the_prompt_sent_ahead_keeps_both_sides() -> None:
    p = planning()
    at = p.start("q", 3, 20_000, 20_000, "standard", False, CacheEstimator()).admit(
        "passages", 3, False
    )
    sent = at.queued(W, 4.0).after(
        "prompt", StageResult(None, 2.5, cut=StageCut("first token predicted late", 2))
    )
    decided = at.after("sentences", StageResult(None, 6.0)).after_evidence(0.9, 0.2)
    joined = decided.joined(sent)
    assert (joined.actual.sentences, joined.actual.prompt) == (6.0, 2.5)
    assert joined.knobs.passages == 2
    assert [cut.stage for cut in joined.cuts] == ["passages"]
    assert (joined.worker, joined.queue_wait_ms) == (W, 4.0)
    assert not joined.abstains
