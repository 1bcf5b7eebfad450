"""The loop detector: it fires on the loops a small model falls into, not on a phrase an answer
uses twice on purpose."""

from __future__ import annotations

from generation.guard import RepetitionGuard

LOOP = (
    "You can build an index without locking out writes with CREATE INDEX CONCURRENTLY. "
    "You can build an index without locking out writes with CREATE INDEX CONCURRENTLY. "
)


def _sentences(guard: RepetitionGuard, sentences: list[str]) -> list[bool]:
    return [guard.sentence(s) for s in sentences]


def test_a_sentence_right_after_itself_is_a_loop() -> None:
    first = "It is created when a table is being processed."
    assert _sentences(RepetitionGuard(), [first, first]) == [False, True]


def test_a_sentence_a_third_time_is_a_loop() -> None:
    a, b = "VACUUM FULL rewrites the whole table.", "It takes an exclusive lock."
    assert _sentences(RepetitionGuard(), [a, b, a, b, a]) == [False, False, False, False, True]


def test_a_sentence_used_twice_on_purpose_is_not() -> None:
    a = "The lock is taken on the table."
    b = "Other sessions wait until the command ends."
    assert _sentences(RepetitionGuard(), [a, b, a]) == [False, False, False]


def test_short_repeats_like_yes_are_not() -> None:
    assert _sentences(RepetitionGuard(), ["Yes.", "Yes.", "Yes."]) == [False, False, False]


def test_a_looping_run_without_sentence_ends_is_caught_in_the_stream() -> None:
    guard = RepetitionGuard()
    looped = ("the table is locked and the rows are rewritten and then " * 5).split(" ")
    fired = [guard.feed(word + " ") for word in looped]
    assert any(fired)
    assert fired.index(True) < len(looped) - 1  # caught before the stream's end


def test_a_long_answer_that_never_loops_is_let_through() -> None:
    guard = RepetitionGuard()
    text = " ".join(f"word{i} is followed by word{i + 1} in this answer." for i in range(60))
    assert not any(guard.feed(text[i : i + 7]) for i in range(0, len(text), 7))


def test_words_split_across_deltas_count_once() -> None:
    guard = RepetitionGuard(ngram=3, ngram_repeats=2)
    assert not guard.feed("alpha be")
    assert not guard.feed("ta gamma ")
    assert guard.feed("alpha beta gamma ")
