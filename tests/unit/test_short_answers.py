"""The short answer: the span head's decoding and its offsets (retrieval/sentences/span.py),
its file, the threshold's choice, the stage, and the pipeline carrying a short answer before
the quote's first token and again in `done` (a phrase finder stands in for the head)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from answer_service.pipeline.events import (
    AnswerRequest,
    DoneEvent,
    PipelineEvent,
    ShortAnswerEvent,
    TokenEvent,
)
from budget import Deadline
from retrieval.pool import StagePool
from retrieval.sentences.span import (
    SpanMeta,
    best_span,
    char_span,
    read_span_file,
    token_span,
    whole_words,
    write_span_file,
)
from retrieval.sentences.span_train import choose_threshold, f1, normalize_answer
from retrieval.stages import ShortAnswerRequest, ShortAnswerStage
from tests.builders import make_index, make_pipeline
from tests.fakes.phrase_finder import PhraseFinder
from tests.fakes.scripted_generation import ScriptedGeneration, words

# [CLS] q q [SEP] s s s s [SEP]: the sentence is tokens 4..7.
IN_SENTENCE = np.array([False, False, False, False, True, True, True, True, False])


def logits(peaks: dict[int, float]) -> np.ndarray:
    out = np.zeros(len(IN_SENTENCE))
    for i, v in peaks.items():
        out[i] = v
    return out


def test_the_best_span_is_the_likeliest_start_and_end_inside_the_sentence() -> None:
    # Question tokens score highest but are not the sentence's: never picked.
    first, last, p = best_span(
        logits({1: 20.0, 5: 8.0}), logits({2: 20.0, 6: 8.0}), IN_SENTENCE, 30
    ) or (0, 0, 0.0)
    assert (first, last) == (5, 6)
    assert 0.9 < p <= 1.0


def test_an_end_before_its_start_or_too_far_is_never_picked() -> None:
    # The best end (4) lies before the best start (6): the best valid pair instead.
    found = best_span(logits({6: 9.0, 5: 3.0}), logits({4: 9.0, 7: 3.0}), IN_SENTENCE, 30)
    assert found is not None
    assert found[0] <= found[1]
    # At most two tokens long: 4..7 is out, whatever its logits.
    found = best_span(logits({4: 9.0}), logits({7: 9.0}), IN_SENTENCE, 2)
    assert found is not None
    assert found[1] - found[0] < 2


def test_a_head_pointing_at_cls_gives_a_span_of_low_probability() -> None:
    found = best_span(logits({0: 10.0, 5: 1.0}), logits({0: 10.0, 5: 1.0}), IN_SENTENCE, 30)
    assert found is not None
    assert found[2] < 0.01
    assert best_span(logits({}), logits({}), np.zeros(9, dtype=bool), 30) is None


def test_tokens_map_to_characters_of_the_unchanged_sentence_and_back() -> None:
    sentence = "The  Denver\nBroncos won."
    # What a tokenizer gives: (0, 0) for special and question tokens.
    offsets = [(0, 0), (0, 3), (4, 8), (0, 0), (0, 3), (5, 11), (12, 19), (20, 23), (0, 0)]
    start, end = char_span(offsets, 5, 6)
    assert sentence[start:end] == "Denver\nBroncos"
    assert token_span(offsets, list(IN_SENTENCE), start, end) == (5, 6)
    # A part of a token still takes the whole token; nothing of the sentence: None.
    assert token_span(offsets, list(IN_SENTENCE), 13, 15) == (6, 6)
    assert token_span(offsets, list(IN_SENTENCE), 30, 40) is None


def test_a_span_is_widened_to_whole_words() -> None:
    sentence = "Crème brûlée, 24\u201310."
    assert whole_words(sentence, 6, 8) == (6, 12)  # "br" of "brûlée"
    assert sentence[slice(*whole_words(sentence, 14, 16))] == "24"
    assert whole_words(sentence, 0, 5) == (0, 5)


def test_the_span_file_keeps_its_meta_and_threshold(tmp_path: Path) -> None:
    meta = SpanMeta(rank=4, alpha=8.0, threshold=0.37)
    write_span_file(tmp_path / "span.npz", meta, {"head/weight": np.ones((2, 3))})
    read_meta, arrays = read_span_file(tmp_path / "span.npz")
    assert read_meta == meta
    assert arrays["head/weight"].shape == (2, 3)


def test_the_shipped_span_head_has_a_threshold_and_is_small() -> None:
    meta, arrays = read_span_file(None)
    assert 0.0 < meta.threshold < 1.0
    assert arrays["head/weight"].shape[0] == 2
    shipped = Path(__file__).resolve().parents[2] / "retrieval" / "sentences" / "span.npz"
    assert shipped.stat().st_size < 2_000_000


def test_the_threshold_keeps_the_spans_better_than_half_right() -> None:
    scores = [0.9, 0.8, 0.7, 0.2, 0.1]
    f1s = [1.0, 1.0, 0.6, 0.0, 0.3]
    assert choose_threshold(scores, f1s) == 0.7
    assert choose_threshold([0.9, 0.5], [0.0, 0.2]) == 1.0


def test_squad_normalisation_and_f1() -> None:
    assert normalize_answer("The  Denver Broncos!") == "denver broncos"
    assert f1("the Denver Broncos", "Denver Broncos") == 1.0
    assert f1("Broncos", "Denver Broncos") == pytest.approx(2 / 3)
    assert f1("Carolina", "Denver Broncos") == 0.0


async def test_the_stage_gives_none_where_no_time_is_left() -> None:
    stage = ShortAnswerStage(PhraseFinder(["Broncos"]), StagePool(1))
    request = ShortAnswerRequest("Who won?", "The Broncos won.")
    found = await stage.run(request, Deadline.after_ms(5_000))
    assert found.value is not None
    assert found.value.text == "Broncos"
    now = [0.0]
    spent = Deadline.after_ms(10, clock=lambda: now[0])
    now[0] = 1.0  # a second later: the 10 ms are gone
    late = await stage.run(request, spent)
    assert late.value is None
    assert late.cut is not None


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_index(tmp_path_factory.mktemp("short"))


async def _answer(finder: PhraseFinder, index_dir: Path, mode: str) -> list[PipelineEvent]:
    pipeline, _ = make_pipeline(
        index_dir,
        workers=[ScriptedGeneration(words("Etna is in Sicily."))],
        answer_mode=mode,  # type: ignore[arg-type]
        short=finder,
    )
    prepared = await pipeline.prepare(
        AnswerRequest("Where is Mount Etna?", 5_000, 3), Deadline.after_ms(5_000)
    )
    return [event async for event in pipeline.events(prepared)]


async def test_a_quote_sends_its_short_answer_before_its_first_token(index_dir: Path) -> None:
    finder = PhraseFinder(["Sicily"])
    events = await _answer(finder, index_dir, "quote")
    kinds = [type(e) for e in events]
    assert ShortAnswerEvent in kinds
    assert kinds.index(ShortAnswerEvent) < kinds.index(TokenEvent)
    short = next(e.short_answer for e in events if isinstance(e, ShortAnswerEvent))
    quote = "".join(e.text for e in events if isinstance(e, TokenEvent))
    assert quote[short.start : short.end] == short.text == "Sicily"
    done = events[-1]
    assert isinstance(done, DoneEvent)
    assert done.short_answer == short
    # The head read the question against the quote's first sentence, as sent.
    assert finder.asked == [("Where is Mount Etna?", quote[: len(finder.asked[0][1])])]


async def test_no_short_answer_where_the_head_finds_none_or_no_quote(index_dir: Path) -> None:
    for finder, mode in (
        (PhraseFinder(["Vesuvius"]), "quote"),
        (PhraseFinder(["Sicily"]), "passages"),
    ):
        events = await _answer(finder, index_dir, mode)
        assert not any(isinstance(e, ShortAnswerEvent) for e in events)
        done = events[-1]
        assert isinstance(done, DoneEvent)
        assert done.short_answer is None
