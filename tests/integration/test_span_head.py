"""The shipped span head on the real packaged MiniLM and its tokenizer: every span it gives
is characters of the unchanged sentence (accents, dashes, runs of white space and line breaks
kept), whole words; it finds the answer in a SQuAD sentence; and a head for another embedder
is refused."""

from __future__ import annotations

import pytest

from retrieval.errors import RetrievalError
from retrieval.sentences.span import SpanConfig, SpanReader

pytestmark = pytest.mark.integration

SUPER_BOWL = (
    "The American Football Conference (AFC) champion Denver Broncos defeated the National "
    "Football Conference (NFC) champion Carolina Panthers 24\u201310 to earn their third Super "
    "Bowl title."
)
ODD = [
    SUPER_BOWL,
    "Crème  brûlée\nis served at the Café de Flore, in Paris,   since 1887.",
    "\u201cIt was built,\u201d she said, \u201cby Anna Berg \u2014 in 1932.\u201d",
    "Tesla (10 July 1856 \u2013 7 January 1943) was a Serbian-American inventor.",
]


@pytest.fixture(scope="module", params=["torch", "onnx"])
def head(request: pytest.FixtureRequest) -> SpanReader:
    """As it serves: torch in float32, or ONNX Runtime in int8 (the CPU's default)."""
    reader = SpanReader(SpanConfig(device="cpu", runtime=request.param))
    reader.warm_up()
    return reader


@pytest.mark.parametrize(
    "question", ["Who won?", "When was it built?", "Where is it served?", "What was the score?"]
)
def test_a_span_is_whole_words_of_the_unchanged_sentence(head: SpanReader, question: str) -> None:
    for sentence, found in zip(ODD, head.spans(question, ODD), strict=True):
        assert found is not None
        assert sentence[found.start : found.end] == found.text
        assert found.text == found.text.strip()
        assert found.start == 0 or not sentence[found.start - 1].isalnum()
        assert found.end == len(sentence) or not sentence[found.end].isalnum()
        assert 0.0 <= found.score <= 1.0


def test_it_finds_the_answer_in_a_squad_sentence(head: SpanReader) -> None:
    (best,) = head.spans("Which NFL team represented the AFC at Super Bowl 50?", [SUPER_BOWL])
    assert best is not None
    assert "Broncos" in best.text
    score = head.find("What was the final score of Super Bowl 50?", SUPER_BOWL)
    assert score is not None, "sure enough to be given"
    assert score.text == "24\u201310"


def test_a_head_for_another_embedder_is_refused() -> None:
    with pytest.raises(RetrievalError, match="adapts"):
        SpanReader(SpanConfig(device="cpu"), "some/other-model").warm_up()
