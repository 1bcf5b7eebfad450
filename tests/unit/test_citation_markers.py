"""Where citation markers go: after a sentence's closing punctuation, never at the start of a
line, inside a code fence or inside inline code; the model's own unchecked markers go."""

from __future__ import annotations

from answer_service.pipeline.attribution import Attributor, Citation, with_markers
from retrieval.sentences.splitter import split_sentences

PASSAGES = [
    (1, "Green tea is steeped for two minutes in water at 80 degrees."),
    (2, "VACUUM FULL takes an ACCESS EXCLUSIVE lock on the table it rewrites."),
]


def cited(answer: str) -> str:
    attributor = Attributor(PASSAGES)
    citations: list[Citation] = []
    for span in split_sentences(answer):
        if (c := attributor.cite(span, answer[span.start : span.end])) is not None:
            citations.append(c)
    return with_markers(answer, citations)


def test_a_marker_follows_the_closing_punctuation() -> None:
    assert cited("Green tea is steeped for two minutes.") == (
        "Green tea is steeped for two minutes. [1]"
    )
    assert cited('It is steeped for "two minutes at 80 degrees."') == (
        'It is steeped for "two minutes at 80 degrees." [1]'
    )


def test_markers_stay_at_the_end_of_their_line_not_the_start_of_the_next() -> None:
    answer = "Green tea is steeped for two minutes.\nVACUUM FULL takes an ACCESS EXCLUSIVE lock."
    assert cited(answer) == (
        "Green tea is steeped for two minutes. [1]\nVACUUM FULL takes an ACCESS EXCLUSIVE lock. [2]"
    )


def test_no_marker_inside_a_code_fence_and_the_code_is_left_as_written() -> None:
    answer = (
        "VACUUM FULL takes an ACCESS EXCLUSIVE lock.\n\n```sql\nVACUUM FULL t; -- a[1] [2]\n```"
    )
    out = cited(answer)
    assert out.startswith("VACUUM FULL takes an ACCESS EXCLUSIVE lock. [2]\n\n```sql\n")
    assert out.endswith("```")
    assert "VACUUM FULL t; -- a[1] [2]\n```" in out  # code untouched, no marker added


def test_no_marker_inside_inline_code() -> None:
    out = cited("Run `VACUUM FULL. tbl` to take an ACCESS EXCLUSIVE lock on the table.")
    assert out.endswith("the table. [2]")
    assert "`VACUUM FULL. tbl`" in out


def test_the_models_own_markers_are_dropped() -> None:
    assert cited("Green tea is steeped for two minutes [2]. Unrelated words here [1].") == (
        "Green tea is steeped for two minutes. [1] Unrelated words here."
    )
