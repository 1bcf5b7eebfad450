"""An interrupted evaluation resumes without redoing finished queries."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from eval.commands.retrieval_quality import evaluate_retrieval
from eval.lib.checkpoint import RunCheckpoint
from retrieval.judgments import Query

QUERIES = [Query(f"q{i}", f"question {i}") for i in range(6)]
QRELS = {f"q{i}": {f"d{i}": 1} for i in range(6)}


class CountingSource:
    def __init__(self, fail_after: int | None = None) -> None:
        self.calls = 0
        self.fail_after = fail_after

    async def modes(self) -> tuple[str, ...]:
        return ("dense", "lexical")

    async def rank(self, query: str, mode: str, depth: int) -> list[str]:
        if self.fail_after is not None and self.calls >= self.fail_after:
            raise KeyboardInterrupt
        self.calls += 1
        number = query.split()[-1]
        return [f"d{number}", "other"] if mode == "dense" else ["other", f"d{number}"]


def test_resume_skips_finished_queries_and_scores_all(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    identity = {"run": 1}
    first = RunCheckpoint(out, identity)
    with pytest.raises(KeyboardInterrupt):
        asyncio.run(
            evaluate_retrieval(CountingSource(fail_after=7), QUERIES, QRELS, first, progress=False)
        )
    first.close()
    assert (tmp_path / "result.json.partial.jsonl").is_file()
    source = CountingSource()
    second = RunCheckpoint(out, identity)
    result = asyncio.run(evaluate_retrieval(source, QUERIES, QRELS, second, progress=False))
    second.finish()
    assert source.calls == 12 - 7
    assert result.metrics["dense"]["mrr@10"] == 1.0
    assert result.metrics["lexical"]["mrr@10"] == 0.5
    assert not (tmp_path / "result.json.partial.jsonl").exists()


def test_a_different_run_does_not_reuse_a_checkpoint(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    first = RunCheckpoint(out, {"run": 1})
    first.record("dense/q0", ["d0"])
    first.close()
    assert RunCheckpoint(out, {"run": 2}).done == {}
    assert RunCheckpoint(out, {"run": 1}).done == {}, "the other run's checkpoint was dropped"


def test_the_checkpoint_goes_into_a_folder_that_does_not_exist_yet(tmp_path: Path) -> None:
    out = tmp_path / "new" / "deeper" / "result.json"
    checkpoint = RunCheckpoint(out, {"run": 1})
    checkpoint.record("q0", [1])
    checkpoint.close()
    assert RunCheckpoint(out, {"run": 1}).done == {"q0": [1]}
