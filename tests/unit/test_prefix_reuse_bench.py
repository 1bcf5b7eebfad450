"""The prefix-reuse benchmark's workload and its warm-up window (eval/bench/prefix_reuse.py)."""

from __future__ import annotations

from eval.bench.prefix_reuse import WorkItem, _from, zipf_workload
from eval.commands.answers import AnswerRecord
from eval.lib.questions import Question


def _topics() -> dict[str, list[WorkItem]]:
    return {
        f"t{t}": [
            WorkItem(Question(f"q{t}.{n}", f"question {t}.{n}?", (f"answer {t}",), f"p{t}"),
                     "squad", f"t{t}")
            for n in range(3)
        ]
        for t in range(50)
    }  # fmt: skip


def test_the_workload_is_seeded_zipf_with_ids_unique_per_request() -> None:
    items = zipf_workload(_topics(), 400, 1.1, seed=3)
    assert items == zipf_workload(_topics(), 400, 1.1, seed=3)
    assert len({item.question.question_id for item in items}) == 400
    counts = sorted(
        (sum(item.topic == topic for item in items) for topic in _topics()), reverse=True
    )
    # Zipf over topics: the most asked topic far above the median one.
    assert counts[0] > 5 * counts[len(counts) // 2]


def test_the_window_after_warm_up_holds_only_the_later_requests() -> None:
    items = zipf_workload(_topics(), 10, 1.1, seed=0)
    records = [
        AnswerRecord(
            item.question.question_id, "ok", "", (), (), ttft_ms=100.0 * n, e2e_ms=0.0,
            prompt_tokens=100, cached_tokens=10 * n,
        )
        for n, item in enumerate(items)
    ]  # fmt: skip
    later = _from(items, records[::-1], 6)  # records come back in any order
    assert later["from_request"] == 6
    assert later["prompt_tokens"] == 400
    assert later["cached_tokens"] == 60 + 70 + 80 + 90
    assert later["ttft_mean_ms"] == 750.0
