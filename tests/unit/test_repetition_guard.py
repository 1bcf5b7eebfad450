"""The loop detector: it fires on the loops a small model falls into, not on a phrase an answer
uses twice on purpose."""

from __future__ import annotations

from generation.guard import RepetitionGuard

LOOP = (
    "You can build an index without locking out writes with CREATE INDEX CONCURRENTLY. "
    "You can build an index without locking out writes with CREATE INDEX CONCURRENTLY. "
)


def _sentences(guard: RepetitionGuard, sentences: list[str]) -> list[str]:
    return [guard.sentence(s) for s in sentences]


def test_a_sentence_right_after_itself_is_a_loop() -> None:
    first = "It is created when a table is being processed."
    assert _sentences(RepetitionGuard(), [first, first]) == ["new", "loop"]


def test_a_sentence_a_third_time_is_a_loop() -> None:
    a, b = "VACUUM FULL rewrites the whole table.", "It takes an exclusive lock."
    assert _sentences(RepetitionGuard(), [a, b, a, b, a]) == [
        "new",
        "new",
        "repeat",
        "repeat",
        "loop",
    ]


def test_a_sentence_said_again_later_is_a_repeat_not_a_loop() -> None:
    a = "The lock is taken on the table."
    b = "Other sessions wait until the command ends."
    assert _sentences(RepetitionGuard(), [a, b, a]) == ["new", "new", "repeat"]


def test_a_phrase_used_twice_in_different_sentences_is_neither() -> None:
    guard = RepetitionGuard()
    said = [
        "The lock is taken when the command starts.",
        "Other sessions wait until the lock is released.",
    ]
    assert _sentences(guard, said) == ["new", "new"]
    assert not guard.feed(" ".join(said))


def test_sentences_compare_by_their_words_as_answers_do() -> None:
    a = "The table is rewritten, then the lock is released."
    assert _sentences(RepetitionGuard(), [a, "A table is rewritten; then lock is released!"]) == [
        "new",
        "loop",
    ]


def test_short_repeats_like_yes_are_not() -> None:
    assert _sentences(RepetitionGuard(), ["Yes.", "Yes.", "Yes."]) == ["new", "new", "new"]


def test_a_sentence_being_written_may_repeat_while_it_begins_like_one_said() -> None:
    guard = RepetitionGuard()
    assert not guard.may_repeat("The lock")  # nothing said yet
    guard.sentence("The lock is taken on the table.")
    assert guard.may_repeat(" The")  # only an article so far: anything may follow
    assert guard.may_repeat("```\n")  # a code block's fence, no word yet: the same
    assert guard.may_repeat("\n- ")  # a list item's bullet
    assert guard.may_repeat("The lock is ta")  # its last word cut short
    assert not guard.may_repeat("The lock is released")
    assert not guard.may_repeat("Other sessions")
    assert not guard.may_repeat("  ")
    # A word that has ended must be the said sentence's whole word.
    assert guard.may_repeat("The lo")
    assert not guard.may_repeat("The lo. ")
    assert guard.may_repeat("The lock is ")


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
