"""The model-free rewrite of a follow-up (retrieval/query_rewrite.py): on a real BM25 index of a
few pages, and on the uniform weights an index without BM25 gets."""

from __future__ import annotations

import pytest

from budget import Deadline
from retrieval.index.bm25_index import BM25Config, BM25Index
from retrieval.query_rewrite import (
    Conversation,
    FollowUpRewriter,
    RewriteConfig,
    RewriteStage,
    Turn,
    UniformWeights,
)

PAGES = [
    "VACUUM reclaims storage occupied by dead tuples. VACUUM FULL rewrites the table.",
    "VACUUM FULL requires an ACCESS EXCLUSIVE lock on the table it is working on.",
    "The lock modes of PostgreSQL: ACCESS SHARE, ROW SHARE, ACCESS EXCLUSIVE and more.",
    "The table is the basic unit of storage. A table has columns and rows.",
    "work_mem sets the base maximum amount of memory to be used by a query operation.",
    "shared_buffers sets the amount of memory the database server uses for shared buffers.",
]


@pytest.fixture(scope="module")
def bm25() -> BM25Index:
    return BM25Index.build(PAGES, BM25Config())


def _ask(rewriter: FollowUpRewriter, query: str, *earlier: str) -> str:
    history = tuple(Turn("user", text) for text in earlier)
    return rewriter.rewrite(Conversation(query, history)).query


def test_a_question_without_history_is_searched_as_asked(bm25: BM25Index) -> None:
    rewriter = FollowUpRewriter(bm25)
    assert _ask(rewriter, "What lock does it take?") == "What lock does it take?"


def test_a_follow_up_keeps_its_words_and_carries_the_earlier_question_s(
    bm25: BM25Index,
) -> None:
    rewrite = FollowUpRewriter(bm25).rewrite(
        Conversation(
            "What lock does it take?",
            (Turn("user", "What does VACUUM FULL do to the table?"),),
        )
    )
    assert rewrite.query.startswith("What lock does it take? ")
    assert "VACUUM" in rewrite.carried
    assert "FULL" in rewrite.carried
    # Question words and words the follow-up already has are not carried.
    assert not {"What", "does", "do", "the"} & set(rewrite.carried)


def test_rarer_words_are_carried_before_common_ones(bm25: BM25Index) -> None:
    rewriter = FollowUpRewriter(bm25, RewriteConfig(max_terms=1, min_share=0.0))
    # "work_mem" is on one page, "table" on three: only the rarer one is kept.
    rewrite = rewriter.rewrite(Conversation("And its default?", (Turn("user", "table work_mem"),)))
    assert rewrite.carried == ("work_mem",)


def test_the_last_question_outweighs_older_ones(bm25: BM25Index) -> None:
    rewriter = FollowUpRewriter(bm25, RewriteConfig(max_terms=1, min_share=0.0))
    rewrite = rewriter.rewrite(
        Conversation(
            "And the default?",
            (Turn("user", "What is shared_buffers?"), Turn("user", "What is work_mem?")),
        )
    )
    assert rewrite.carried == ("work_mem",)


def test_assistant_turns_are_read_past(bm25: BM25Index) -> None:
    rewriter = FollowUpRewriter(bm25)
    asked = Conversation(
        "And the default?", (Turn("assistant", "work_mem sets the memory of a sort."),)
    )
    assert rewriter.rewrite(asked).query == "And the default?"


def test_a_follow_up_pointing_back_carries_the_entities_of_the_answer_before_it(
    bm25: BM25Index,
) -> None:
    rewriter = FollowUpRewriter(bm25)
    history = (
        Turn("user", "Which command gives the space of dead rows back?"),
        Turn("assistant", "VACUUM FULL rewrites the table, which returns the space."),
    )
    rewrite = rewriter.rewrite(Conversation("What lock does it take?", history))
    # The questions' words first, then the answer's entities (its plain words are not carried).
    assert rewrite.carried[-2:] == ("VACUUM", "FULL")
    assert "rewrites" not in rewrite.carried
    assert "table" not in rewrite.carried
    # It is read with the entities alone: the names "it" points back to.
    assert rewrite.read_query == "What lock does it take? VACUUM FULL"
    # A follow-up that names what it asks about carries none of the answer's words.
    named = rewriter.rewrite(Conversation("What does work_mem set?", history))
    assert "VACUUM" not in named.carried
    # Off: assistant turns are read past, and nothing carried is an entity: read as asked.
    off = FollowUpRewriter(bm25, RewriteConfig(answer_entities=False))
    plain = off.rewrite(Conversation("What lock does it take?", history))
    assert "VACUUM" not in plain.carried
    assert plain.carried
    assert plain.read_query == "What lock does it take?"


def test_words_no_page_holds_are_not_carried(bm25: BM25Index) -> None:
    rewrite = FollowUpRewriter(bm25).rewrite(
        Conversation("And then?", (Turn("user", "zyzzyva quux work_mem"),))
    )
    assert rewrite.carried == ("work_mem",)


def test_uniform_weights_carry_content_words_without_an_index() -> None:
    rewrite = FollowUpRewriter(UniformWeights()).rewrite(
        Conversation("What about its lock?", (Turn("user", "How do I run VACUUM FULL?"),))
    )
    assert rewrite.carried == ("run", "VACUUM", "FULL")


def test_idf_is_higher_for_rarer_words_and_none_for_stopwords(bm25: BM25Index) -> None:
    rare, common = bm25.idf("work_mem"), bm25.idf("table")
    assert rare is not None
    assert common is not None
    assert rare > common
    assert bm25.idf("the") is None
    assert bm25.idf("zyzzyva") is None


async def test_the_stage_gives_the_rewritten_query_with_its_sizes(bm25: BM25Index) -> None:
    stage = RewriteStage(FollowUpRewriter(bm25))
    result = await stage.run(
        Conversation("What lock does it take?", (Turn("user", "What is VACUUM FULL?"),)),
        Deadline.after_ms(1000),
    )
    assert stage.name == "rewrite"
    assert result.value.query.startswith("What lock does it take? ")
    assert result.value.read_query == "What lock does it take? VACUUM FULL"
    assert result.attributes["answer.rewrite.turns"] == 1
    assert result.attributes["answer.rewrite.carried_terms"] == 2
    assert result.elapsed_ms < 50
