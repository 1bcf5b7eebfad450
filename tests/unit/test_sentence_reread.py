"""The reader's mix (retrieval/sentences/reader.py) and its stage (retrieval/stages.py): the
reader reads only where the scorer is in doubt, only its best quotable sentences, and its
scores reorder them; when it has no time, the scorer's order stands with a cut."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from budget import Deadline
from retrieval.passage import Passage
from retrieval.pool import StagePool
from retrieval.sentences.reader import ReadMix, best_chance, reread, to_read
from retrieval.sentences.scorer import Candidate, ScoredSentence
from retrieval.sentences.store import SentenceRef
from retrieval.stages import ReadRequest, ReadStage

MIX = ReadMix(depth=2, doubt=0.6, weight=1.0, slope=1.0, intercept=0.0)


def ranked(scores: list[float], kinds: Sequence[str] = ()) -> list[ScoredSentence]:
    """One passage whose sentences `s0`, `s1`, ... the scorer gave `scores` (best first out)."""
    texts = [f"Sentence number s{i} says something." for i in range(len(scores))]
    text = " ".join(texts)
    passage = Passage("doc#0", "doc", 0, "Doc", text, 0, len(text))
    out, start = [], 0
    for i, (sentence, score) in enumerate(zip(texts, scores, strict=True)):
        kind = kinds[i] if i < len(kinds) else "prose"
        ref = SentenceRef(i, 0, start, start + len(sentence), i, True, kind)  # type: ignore[arg-type]
        probability = 1 / (1 + math.exp(-score))
        out.append(ScoredSentence(Candidate(ref, passage, 0), probability, score=score))
        start += len(sentence) + 1
    return sorted(out, key=lambda s: -s.score)


class FakeReader:
    """Scores by a table keyed on the sentence's name (`s<i>`), counting what it read."""

    name = "fake-reader"

    def __init__(self, scores: dict[str, float], delay_s: float = 0.0) -> None:
        self._scores = scores
        self._delay_s = delay_s
        self.read_names: list[str] = []

    def read(self, question: str, found: Sequence[Candidate]) -> npt.NDArray[np.float64]:
        time.sleep(self._delay_s)
        names = [c.text.split()[2] for c in found]
        self.read_names.extend(names)
        return np.asarray([self._scores.get(n, 0.0) for n in names])


def name(sentence: ScoredSentence) -> str:
    return sentence.candidate.text.split()[2]


def test_a_sure_scorer_is_not_read_and_keeps_its_order() -> None:
    first = ranked([5.0, 0.0, -1.0])
    assert best_chance(first) > MIX.doubt
    assert to_read(first, MIX) == []
    reader = FakeReader({"s2": 100.0})
    out, read = reread(first, MIX, lambda found: reader.read("q", found))
    assert read == 0
    assert reader.read_names == []
    assert [name(s) for s in out] == ["s0", "s1", "s2"]
    # Probabilities follow the mix's calibration of the (unchanged) scores.
    assert out[0].probability == pytest.approx(1 / (1 + math.exp(-5.0)))


def test_in_doubt_the_reader_reads_the_best_quotable_and_reorders_them() -> None:
    first = ranked([1.0, 0.9, 0.8, 0.7], kinds=["prose", "code", "prose", "prose"])
    reader = FakeReader({"s0": 0.0, "s2": 3.0, "s3": 50.0})
    out, read = reread(first, MIX, lambda found: reader.read("q", found))
    # Depth 2 of the quotable ones: s0 and s2 (s1 is code), never s3 however it would score.
    assert reader.read_names == ["s0", "s2"]
    assert read == 2
    assert [name(s) for s in out][:2] == ["s2", "s0"]
    by_name = {name(s): s.score for s in out}
    assert by_name["s2"] == pytest.approx(0.8 + 3.0)
    # What was not read counts the lowest score the reader gave (0.0 here).
    assert by_name["s3"] == pytest.approx(0.7 + 0.0)
    assert by_name["s1"] == pytest.approx(0.9 + 0.0)


def test_without_a_read_the_first_pass_is_only_recalibrated() -> None:
    first = ranked([1.0, 0.9, 0.8])
    out, read = reread(first, ReadMix(2, 0.6, 1.0, slope=2.0, intercept=-1.0), None)
    assert read == 0
    assert [name(s) for s in out] == ["s0", "s1", "s2"]
    assert out[0].probability == pytest.approx(1 / (1 + math.exp(-(2.0 * 1.0 - 1.0))))


def test_the_mix_is_read_from_the_scorers_weights_file(tmp_path: Path) -> None:
    path = tmp_path / "scorer.json"
    path.write_text(json.dumps({"reader": MIX.to_json()}))
    assert ReadMix.read(path) == MIX
    path.write_text(json.dumps({"weights": []}))
    assert ReadMix.read(path) is None


async def test_the_stage_reads_and_reports_what_it_read() -> None:
    reader = FakeReader({"s1": 9.0})
    stage = ReadStage(reader, MIX, StagePool(1))
    result = await stage.run(ReadRequest("q", ranked([1.0, 0.9, 0.8])), Deadline.after_ms(5_000))
    assert next(name(s) for s in result.value) == "s1"
    assert result.work == 2
    assert result.cut is None
    assert result.attributes["read.sentences"] == 2


async def test_a_reader_out_of_time_leaves_the_scorers_order_with_a_cut() -> None:
    reader = FakeReader({"s1": 9.0}, delay_s=0.5)
    stage = ReadStage(reader, MIX, StagePool(1))
    result = await stage.run(ReadRequest("q", ranked([1.0, 0.9, 0.8])), Deadline.after_ms(50))
    assert [name(s) for s in result.value] == ["s0", "s1", "s2"]
    assert result.cut is not None
    assert "timed out" in result.cut.reason


async def test_a_slice_shorter_than_a_read_is_not_spent_reading() -> None:
    reader = FakeReader({"s1": 9.0})
    stage = ReadStage(reader, MIX, StagePool(1))
    # Two sentences to read at the prior's 20 ms each: 40 ms needed, 10 ms given.
    result = await stage.run(ReadRequest("q", ranked([1.0, 0.9, 0.8])), Deadline.after_ms(10))
    assert reader.read_names == []
    assert [name(s) for s in result.value] == ["s0", "s1", "s2"]
    assert result.cut is not None
    assert "read skipped" in result.cut.reason


async def test_the_expected_cost_follows_the_reads_it_times() -> None:
    reader = FakeReader({"s1": 9.0}, delay_s=0.2)
    stage = ReadStage(reader, MIX, StagePool(1))
    before = stage.expected_ms(2)
    await stage.run(ReadRequest("q", ranked([1.0, 0.9, 0.8])), Deadline.after_ms(5_000))
    # 200 ms for two sentences observed: the estimate moves toward 100 ms a sentence.
    assert stage.expected_ms(2) > before
