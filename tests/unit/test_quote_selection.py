"""Picking the quote (retrieval/sentences/quote.py): the best sentence first, the one it leans
on before it, others when their chance of answering pays for their length, never longer than
`max_words` words, nothing below `min_probability`."""

from __future__ import annotations

import dataclasses
import math

from retrieval.passage import Passage
from retrieval.sentences.quote import QuoteConfig, select_quote
from retrieval.sentences.scorer import Candidate, ScoredSentence
from retrieval.sentences.store import SentenceRef
from tests.builders import scored_page


def sentences(texts: list[str], probabilities: list[float]) -> list[ScoredSentence]:
    """One passage of `texts` (in order), ranked by `probabilities` as the scorer would, each
    scored by its log-odds."""
    text = " ".join(texts)
    passage = Passage("doc#0", "doc", 0, "Doc", text, 0, len(text))
    out, start = [], 0
    for position, (sentence, probability) in enumerate(zip(texts, probabilities, strict=True)):
        ref = SentenceRef(position, 0, start, start + len(sentence), position, True, "prose")
        score = math.log(probability / (1 - probability))
        out.append(ScoredSentence(Candidate(ref, passage, 0), probability, score=score))
        start += len(sentence) + 1
    return sorted(out, key=lambda s: -s.probability)


CONFIG = QuoteConfig(min_probability=0.1, words_weight=0.008, max_words=80)


def test_the_best_sentence_goes_first_and_nothing_below_the_floor() -> None:
    found = sentences(
        ["Denver won the game in 2016.", "The weather was mild that week."], [0.9, 0.2]
    )
    quote = select_quote(found, CONFIG)
    assert [q.text for q in quote] == ["Denver won the game in 2016."]
    assert select_quote(sentences(["Nothing here answers."], [0.05]), CONFIG) == []


def test_a_sentence_that_leans_back_brings_the_one_before() -> None:
    found = sentences(
        ["PostgreSQL can build an index without locking writes.", "It is slower to build."],
        [0.3, 0.8],
    )
    quote = select_quote(found, CONFIG)
    assert [q.text for q in quote] == [
        "PostgreSQL can build an index without locking writes.",
        "It is slower to build.",
    ]


def test_no_lead_in_that_is_not_a_whole_sentence() -> None:
    """A best sentence that leans back on a fragment (the window cut the sentence before it)
    or a heading is quoted alone: never "." or "Canceling Queries" before it."""
    found = sentences([".", "Thus, the standby server still writes to disk."], [0.1, 0.8])
    cut = [
        dataclasses.replace(
            s,
            candidate=dataclasses.replace(
                s.candidate, ref=dataclasses.replace(s.candidate.ref, whole=False)
            ),
        )
        if s.candidate.text == "."
        else s
        for s in found
    ]
    quote = select_quote(cut, CONFIG)
    assert [q.text for q in quote] == ["Thus, the standby server still writes to disk."]


def test_a_further_sentence_joins_when_its_chance_pays_for_its_length() -> None:
    found = sentences(
        ["The treaty was signed in 1848.", "Mexico ceded the land.", "Word " * 40 + "end."],
        [0.8, 0.7, 0.6],
    )
    # Chances 0.51, 0.30 and 0.19: the short one pays for its 4 words (0.032 needed), the long
    # one not for its 41 (0.33 needed).
    quote = select_quote(found, CONFIG)
    assert [q.text for q in quote] == ["The treaty was signed in 1848.", "Mexico ceded the land."]
    # At a higher price per word (0.4 for four words) the best sentence stands alone.
    strict = QuoteConfig(min_probability=0.1, words_weight=0.1, max_words=80)
    assert [q.text for q in select_quote(found, strict)] == ["The treaty was signed in 1848."]


def test_a_sentence_that_leads_into_what_follows_never_joins() -> None:
    found = sentences(
        ["From PostgreSQL 11 a constant default is stored once.", "To add a column, use:"],
        [0.8, 0.75],
    )
    quote = select_quote(found, CONFIG)
    assert [q.text for q in quote] == ["From PostgreSQL 11 a constant default is stored once."]


def test_a_clear_best_sentence_is_quoted_alone() -> None:
    found = sentences(
        ["The treaty was signed in 1848.", "Mexico ceded the land.", "It rained."],
        [0.95, 0.05, 0.04],
    )
    # The others' chances (about 0.003 each) do not pay for even four words.
    quote = select_quote(found, CONFIG)
    assert [q.text for q in quote] == ["The treaty was signed in 1848."]


def test_a_long_sentence_is_cut_around_the_question_and_never_past_max_words() -> None:
    words = [f"w{i}" for i in range(200)]
    words[120:123] = ["the", "treaty", "signed"]
    found = sentences([" ".join(words) + "."], [0.9])
    for max_words in (80, 30, 12):
        config = QuoteConfig(min_probability=0.1, max_words=max_words)
        (quote,) = select_quote(found, config, "When was the treaty signed?")
        # Cut at both ends: the ellipses count as words too.
        assert quote.text.startswith("… ")
        assert quote.text.endswith(" …")
        assert len(quote.text.split()) == max_words
        assert "treaty signed" in quote.text


def test_a_long_sentence_answered_at_its_start_keeps_its_start() -> None:
    words = [f"w{i}" for i in range(200)]
    words[2:5] = ["the", "treaty", "signed"]
    found = sentences([" ".join(words) + "."], [0.9])
    (quote,) = select_quote(found, QuoteConfig(min_probability=0.1, max_words=40), "treaty signed")
    assert quote.text.startswith("w0 w1 the treaty signed")
    assert quote.text.endswith(" …")
    assert len(quote.text.split()) == 40


def test_the_cut_counts_the_question_terms_a_window_holds_not_their_repeats() -> None:
    words = [f"w{i}" for i in range(200)]
    words[20:23] = ["treaty", "treaty", "treaty"]
    words[150:153] = ["the", "treaty", "signed"]
    found = sentences([" ".join(words) + "."], [0.9])
    config = QuoteConfig(min_probability=0.1, max_words=30)
    (quote,) = select_quote(found, config, "When was the treaty signed?")
    assert "treaty signed" in quote.text


# Two entries of a definition list, as the PostgreSQL manual writes its settings.
SETTINGS = """max_connections (integer)

 Determines the maximum number of concurrent connections to the
 database server. The default is typically 100 connections.

superuser_reserved_connections (integer)

 Determines the number of connection slots that are reserved for
 superusers. The default value is three connections.
"""


def test_a_sentence_of_a_definition_is_quoted_after_its_term() -> None:
    """Its sentences leave out what they are about: without the term, "Determines the maximum
    number of concurrent connections" does not say which setting does, and "The default value
    is three connections" reads as the answer to "What is the default of max_connections?"."""
    (quote,) = select_quote(scored_page(SETTINGS, {"Determines the maximum": 0.9}), CONFIG)
    assert quote.text == (
        "max_connections (integer): Determines the maximum number of concurrent connections "
        "to the database server."
    )
    assert quote.sentence.startswith("Determines the maximum")
    (quote,) = select_quote(scored_page(SETTINGS, {"The default value": 0.9}), CONFIG)
    assert quote.text == (
        "superuser_reserved_connections (integer): The default value is three connections."
    )


def test_a_term_is_said_once_for_the_sentences_of_its_paragraph() -> None:
    quote = select_quote(
        scored_page(SETTINGS, {"Determines the maximum": 0.6, "The default is typically": 0.59}),
        CONFIG,
    )
    assert [q.text for q in quote] == [
        "max_connections (integer): Determines the maximum number of concurrent connections "
        "to the database server.",
        "The default is typically 100 connections.",
    ]


def test_a_short_sentence_of_a_definition_counts_its_term() -> None:
    """ "Default is 100." alone is too short to quote (a fragment may be that short); after its
    term it answers."""
    text = "fillfactor (integer)\n\n Default is 100. It must be between 10 and 100.\n"
    quote = select_quote(scored_page(text, {"Default": 0.9}), CONFIG)
    assert quote[0].text == "fillfactor (integer): Default is 100."
    plain = "Some text before it.\n\n Default is 100. It must be between 10 and 100.\n"
    assert "Default is 100." not in [
        q.text for q in select_quote(scored_page(plain, {"Default": 0.9}), CONFIG)
    ]
