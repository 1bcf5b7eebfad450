"""The sentence scorer's mechanics on a real index of the builders' documents: one feature row
per sentence of the retrieved passages, probabilities in (0, 1) that follow the ranking score,
the answering sentence first for a plain question, and the shipped weights readable."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import pytest

from retrieval.index.loaded import LoadedIndex
from retrieval.passage import Passage
from retrieval.sentences.scorer import (
    FEATURES,
    Candidate,
    ScorerWeights,
    SentenceScorer,
    candidates,
    feature_matrix,
)
from retrieval.sentences.store import SentenceStore, embed_passages
from tests.builders import make_index
from tests.fakes.hash_embedder import HashEmbedder


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> LoadedIndex:
    directory = make_index(tmp_path_factory.mktemp("scorer"))
    embedder = HashEmbedder()
    return LoadedIndex.open(directory, embedder=embedder.name, dimension=embedder.dimension)


def _store(passages: Sequence[Passage]) -> SentenceStore:
    """The passages' sentences with the vectors their own pass gives them."""
    return SentenceStore.build(passages, embed_passages(passages, HashEmbedder()).sentence_vectors)


def _rows(index: LoadedIndex) -> list[tuple[int, object]]:
    return [(row, index.passage(row)) for row in range(len(index))]


def test_one_row_of_features_per_sentence(index: LoadedIndex) -> None:
    found = candidates(index.sentences, _rows(index))  # type: ignore[arg-type]
    vector = HashEmbedder().encode(["Where is Mount Etna?"])
    matrix = feature_matrix("Where is Mount Etna?", vector, found, index.sentences)
    assert matrix.shape == (len(found), len(FEATURES))
    assert np.isfinite(matrix).all()
    assert (matrix[:, FEATURES.index("bias")] == 1.0).all()


def test_the_shipped_scorer_puts_the_answer_first(index: LoadedIndex) -> None:
    weights = ScorerWeights.read()
    scorer = SentenceScorer(index.sentences, weights)
    question = "Where is Mount Etna?"
    ranked = scorer.score(question, HashEmbedder().encode([question]), _rows(index))  # type: ignore[arg-type]
    assert "Mount Etna" in ranked[0].candidate.text
    probabilities = [s.probability for s in ranked]
    assert all(0.0 < p < 1.0 for p in probabilities)
    assert probabilities == sorted(probabilities, reverse=True)
    # Each carries its ranking score, which the calibration turns into its probability (the
    # quote prices a further sentence by a softmax of the scores).
    for s in ranked:
        z = weights.slope * s.score + weights.intercept
        assert s.probability == pytest.approx(1.0 / (1.0 + np.exp(-z)))
    scores = [s.score for s in ranked]
    assert scores == sorted(scores, reverse=True)


def test_weights_for_other_features_are_refused() -> None:
    with pytest.raises(ValueError, match="features"):
        ScorerWeights(("bias",), (1.0,), (0.0,), (1.0,))


GAME = {
    "game": (
        "Super Bowl 50",
        "Super Bowl 50 was played in Santa Clara. Super Bowl 50 had a large audience. "
        "Newton was sacked seven times in Super Bowl 50. Super Bowl 50 ended late.",
    ),
    "show": ("Halftime", "The Super Bowl 50 halftime show was headlined by Coldplay."),
}


def test_local_coverage_weighs_the_term_few_candidates_hold(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Every candidate holds the topic ("Super Bowl 50"); the one that also holds "sacked" is
    the only one with most of the question's weight among the candidates, where corpus IDF
    weighs the topic words as much."""
    directory = make_index(tmp_path_factory.mktemp("local"), GAME)
    embedder = HashEmbedder()
    index = LoadedIndex.open(directory, embedder=embedder.name, dimension=embedder.dimension)
    question = "How many times was Newton sacked in Super Bowl 50?"
    found = candidates(index.sentences, _rows(index))  # type: ignore[arg-type]
    matrix = feature_matrix(question, embedder.encode([question]), found, index.sentences)
    local = matrix[:, FEATURES.index("local_cover")]
    sacked = next(i for i, c in enumerate(found) if "sacked" in c.text)
    assert local.argmax() == sacked
    assert matrix[sacked, FEATURES.index("local_margin")] == 0.0
    assert matrix[sacked, FEATURES.index("local_rank")] == 1.0
    others = np.delete(local, sacked)
    assert (others < 0.5 * local[sacked]).all()
    # "seven" is what "how many" asks for, though it is not written in digits.
    assert matrix[sacked, FEATURES.index("number_asked")] == 1.0


def _page(text: str) -> tuple[SentenceStore, list[Candidate]]:
    """One page of a manual as one passage, indexed with the test embedder, and its units."""
    passage = Passage("page#0", "page", 0, "Page", text, 0, len(text))
    store = _store([passage])
    return store, candidates(store, [(0, passage)])


def _whole(text: str) -> dict[str, bool]:
    """Each unit of a page (on one line) and whether it is a whole sentence."""
    return {" ".join(c.text.split()): c.ref.whole for c in _page(text)[1]}


def test_a_heading_or_a_navigation_line_is_not_a_whole_sentence() -> None:
    """A page of a manual as its HTML's text: its title, the navigation line, the title again.
    None of them ends as a sentence does, so none may be quoted or lead into a quote."""
    text = (
        "34.7. Canceling Queries in Progress\nPrev UpChapter 34. libpq — C LibraryHome Next"
        "\n\n34.7. Canceling Queries in Progress\n\n A client application can request"
        "\n cancellation of a command. It uses PQcancel.\n\nHe graduated in 1873.:33"
    )
    whole = _whole(text)
    assert whole["A client application can request cancellation of a command."]
    assert whole["It uses PQcancel."]
    assert whole["He graduated in 1873.:33"]  # a reference marker after the mark
    headings = [t for t in whole if "Canceling" in t or "Next" in t]
    assert headings
    assert not any(whole[t] for t in headings)


def test_a_definitions_sentence_is_scored_with_the_term_it_defines() -> None:
    """ "The default is five minutes." says it of checkpoint_timeout: asked for the default of
    checkpoint_timeout, the scorer sees that sentence hold the setting's name."""
    text = (
        "checkpoint_timeout (integer)\n\n Maximum time between automatic WAL checkpoints.\n"
        " The default is five minutes (5min).\n\n"
        "checkpoint_completion_target (floating point)\n\n Specifies the target of checkpoint"
        " completion. The default is 0.9.\n"
    )
    store, found = _page(text)
    by_text = {c.text: c for c in found}
    five = by_text["The default is five minutes (5min)."]
    assert five.term == "checkpoint_timeout (integer)"
    assert five.with_term == "checkpoint_timeout (integer): The default is five minutes (5min)."
    assert by_text["The default is 0.9."].term == "checkpoint_completion_target (floating point)"
    question = "What is the default value of checkpoint_timeout?"
    vector = HashEmbedder().encode([question])[0]
    matrix = feature_matrix(question, vector, found, store)
    cover = matrix[:, FEATURES.index("cover")]
    other = by_text["The default is 0.9."]
    assert cover[found.index(five)] > cover[found.index(other)]
    # Without the term the two sentences say the same of the question: only "default".
    alone = feature_matrix(
        question, vector, [dataclasses.replace(c, term="") for c in found], store
    )
    assert (
        alone[found.index(five), FEATURES.index("cover")]
        == alone[found.index(other), FEATURES.index("cover")]
    )


def test_a_window_that_starts_inside_a_term_line_reads_its_start_in_the_window_before() -> None:
    """The index's windows overlap and fall anywhere: the second may start inside the
    signature whose description it holds."""
    page = (
        " pg_reload_conf ( )\n → boolean\n\n Causes all processes to reload their"
        " configuration files.\n\n pg_terminate_backend ( pid integer, timeout bigint"
        " DEFAULT 0 )\n → boolean\n\n Terminates the session whose backend process has the"
        " specified process ID.\n"
    )
    cut = page.index("( pid")
    first = Passage("funcs#0", "funcs", 0, "Functions", page[: cut + 10], 0, cut + 10)
    second = Passage("funcs#1", "funcs", 1, "Functions", page[cut:], cut, len(page))
    other = Passage("other#3", "other", 3, "Other", page[: cut + 10], 0, cut + 10)
    store = _store([first, second])
    said = "Terminates the session whose backend process has the specified process ID."

    def term(passage_at: object) -> str:
        found = candidates(store, [(1, second)], passage_at)  # type: ignore[arg-type]
        return next(c.term for c in found if " ".join(c.text.split()) == said)

    signature = "pg_terminate_backend ( pid integer, timeout bigint DEFAULT 0 ) → boolean"
    assert term([first, second].__getitem__) == signature
    assert term(None) == ""  # the window before not known
    assert term([other, second].__getitem__) == ""  # the row before is another document's


@pytest.mark.parametrize("inside", [False, True])
def test_a_term_line_that_ends_the_window_before_defines_the_next_windows_paragraph(
    inside: bool,
) -> None:
    """The windows fall anywhere: the term line may end one window and its paragraph open the
    next, at its start or cut inside its first sentence. The term still defines the
    paragraph's sentences, as it does when one window holds both."""
    page = (
        "max_prepared_transactions (integer)\n\nSets the maximum number of transactions that"
        " can be in the prepared state simultaneously.\n\nwork_mem (integer)\n\nSets the base"
        " maximum amount of memory to be used by a query operation before writing to temporary"
        " disk files. The default value is four megabytes (4MB).\n"
    )
    paragraph = page.index("Sets the base")
    cut = page.index("to be used") if inside else paragraph
    # The windows overlap: the first ends a few words after the second starts.
    first = Passage("mem#0", "mem", 0, "Memory", page[: cut + 12], 0, cut + 12)
    second = Passage("mem#1", "mem", 1, "Memory", page[cut:], cut, len(page))
    store = _store([first, second])
    found = candidates(store, [(1, second)], [first, second].__getitem__)
    by_text = {" ".join(c.text.split()): c for c in found}
    assert by_text["The default value is four megabytes (4MB)."].term == "work_mem (integer)"
    # Not known without the window before.
    alone = candidates(store, [(1, second)])
    assert all(c.term == "" for c in alone)


def _windows(text: str, cuts: list[tuple[int, int]]) -> list[Passage]:
    """A document's overlapping windows at these (start, end) character offsets."""
    return [
        Passage(f"doc#{n}", "doc", n, "Doc", text[start:end], start, end)
        for n, (start, end) in enumerate(cuts)
    ]


def test_a_sentence_a_window_cuts_is_read_whole_from_the_windows_around_it() -> None:
    s1 = "Mount Etna is on the east coast of Sicily."
    s2 = "It is one of the most active volcanoes in the world and is in an almost constant"
    s2 += " state of activity."
    s3 = "Its eruptions have been recorded since 1500 BC."
    text = f"{s1} {s2} {s3}"
    # Overlapping windows: the first ends inside s2, the second starts inside s2 and ends
    # inside s3, the third starts inside s3.
    windows = _windows(
        text,
        [
            (0, text.index("in the world") + 12),
            (text.index("one of the most"), text.index(" have been")),
            (text.index("eruptions"), len(text)),
        ],
    )
    store = _store(windows)
    rows = list(enumerate(windows))
    cut = candidates(store, rows)
    assert [c.ref.whole for c in cut] == [True, False, False, False, False]
    read = candidates(store, rows, windows.__getitem__)
    # Each piece reads as its whole sentence; the quote takes one of the copies (it drops a
    # sentence it already quoted).
    assert [c.text for c in read] == [s1, s2, s2, s3, s3]
    assert all(c.ref.whole for c in read)
    assert [bool(c.head) for c in read] == [False, False, True, False, True]
    assert [bool(c.tail) for c in read] == [False, True, False, True, False]


def test_a_sections_first_window_starts_whole_and_its_term_defines_the_paragraph() -> None:
    """A window never crosses a section's edge, so a section's first window (the document's
    second or later) starts with a whole sentence even in lower case ("initdb creates ..."),
    and a term on its first line defines the paragraph below it."""
    one = "Synopsis\n\ninitdb [option...] [ --pgdata | -D ] directory"
    two = "initdb creates a new PostgreSQL database cluster.\n\nwork_mem (integer)\n\n"
    two += "Sets the base maximum amount of memory. The default is four megabytes."
    text = f"{one}\n\n{two}"
    start = len(one) + 2
    windows = [
        Passage("p#0", "p", 0, "initdb", one, 0, len(one), ("initdb", "Synopsis"), anchor="s"),
        Passage("p#1", "p", 1, "initdb", two, start, len(text), ("initdb", "Description")),
    ]
    store = _store(windows)
    found = candidates(store, [(1, windows[1])], windows.__getitem__)
    assert found[0].text == "initdb creates a new PostgreSQL database cluster."
    assert found[0].ref.whole
    assert [c.term for c in found if c.text.startswith(("Sets", "The default"))] == [
        "work_mem (integer)",
        "work_mem (integer)",
    ]


def test_a_sentence_cut_where_the_window_around_does_not_hold_it_stays_a_fragment() -> None:
    text = "Mount Etna is on the east coast of Sicily. It is one of the most active volcanoes."
    cut = text.index("the most active")
    windows = _windows(text, [(0, cut), (cut - 10, len(text))])
    # The second window is not the first's neighbour in the index (another document's row
    # lies between them), so the first window's last sentence stays cut.
    other = Passage("other#0", "other", 0, "Other", "Something else entirely.", 0, 24)
    store = _store([windows[0], other, windows[1]])
    read = candidates(store, [(0, windows[0])], [windows[0], other, windows[1]].__getitem__)
    assert [c.ref.whole for c in read] == [True, False]
    assert read[1].text == "It is one of"


def test_the_rest_of_a_sentence_after_an_example_is_not_whole() -> None:
    """The manual breaks a sentence around a command; what follows the command is not a
    sentence to quote on its own."""
    text = (
        "Then make a connection to the server with:\n\n ssh -L 63333:foo.com:5432 joe@foo.com"
        "\n\n but then the server sees the connection as coming from foo.com. The tunnel"
        " is encrypted."
    )
    whole = _whole(text)
    assert not whole["but then the server sees the connection as coming from foo.com."]
    assert whole["The tunnel is encrypted."]


def test_a_table_of_contents_has_no_whole_sentence() -> None:
    """A manual's page lists its sections before its text; split as prose its lines make
    "EXPLAIN ANALYZE 14.1.3.", which ends with a dot and is no sentence (quoted, or read as
    the best sentence, it made the service say it does not know what EXPLAIN ANALYZE does)."""
    text = (
        "14.1. Using EXPLAIN\n\n14.1.1. EXPLAIN Basics\n14.1.2. EXPLAIN ANALYZE\n"
        "14.1.3. Caveats\n\n PostgreSQL devises a query plan for each query it receives."
    )
    whole = _whole(text)
    assert whole["PostgreSQL devises a query plan for each query it receives."]
    contents = [
        t for t in whole if "EXPLAIN" in t and "devises" not in t and t != "14.1. Using EXPLAIN"
    ]
    assert contents
    assert not any(whole[t] for t in contents), whole


def test_a_pages_footer_has_no_whole_sentence() -> None:
    """Each page of the manual ends with links to the pages before and after; split as prose
    they make "Prev Up Next 15.4." and "Parallel Safety Home Chapter 16.", which end with a dot
    and are no sentence."""
    text = (
        " Functions marked parallel safe can run in parallel workers.\n\n"
        "Prev Up Next\n15.4. Parallel Safety Home Chapter 16. Installation from Binaries"
    )
    whole = _whole(text)
    assert whole.pop("Functions marked parallel safe can run in parallel workers.")
    assert whole
    assert not any(whole.values()), whole
