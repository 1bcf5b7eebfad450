"""Sources numbered as the prompt numbers them, including a passage a remembered prefix brought
along (adopted) that retrieval did not rank for this question; a passage retrieved but not given
to the model is not a source of the answer."""

from __future__ import annotations

from answer_service.pipeline.values import context_passages, numbered_sources, passage_lookup
from generation.prefix_order import PrefixTree
from generation.prompt_layout import build_prompt
from retrieval.passage import Passage, ScoredPassage
from tests.fakes.word_template import WordTemplate


def _passage(doc: str) -> Passage:
    return Passage(f"{doc}#0", doc, 0, f"T{doc}", f"text of {doc}", 0, 10)


def test_an_adopted_passage_is_a_source_with_its_prompt_number() -> None:
    index = {p.passage_id: p for p in map(_passage, ["aa", "b", "c", "d", "e"])}
    tree = PrefixTree()
    tree.insert(["aa#0", "b#0", "c#0"])  # another question's prompt
    scored = [
        ScoredPassage(index[pid], 1.0 - n / 10) for n, pid in enumerate(["c#0", "b#0", "d#0"])
    ]
    prompt = build_prompt(
        "q?", context_passages(scored), WordTemplate(), tree=tree, limit=3,
        max_prompt_tokens=10_000, layout="cache_aware", adopt=1,
        lookup=passage_lookup(index.get), remember=False,
    )  # fmt: skip
    assert [p.source_id for p in prompt.passages] == ["aa#0", "b#0", "c#0"]
    assert len(tree) == 3  # laid out, not yet sent: not remembered
    sources = numbered_sources(scored, prompt, 40, index.get)
    assert [(s.number, s.passage_id, s.score) for s in sources] == [
        (1, "aa#0", 0.0),  # adopted: not ranked for this question
        (2, "b#0", 0.9),
        (3, "c#0", 1.0),
    ]  # d#0, ranked third, gave its place to the adopted one: the model never saw it
    assert sources[0].doc_id == "aa"
    assert sources[0].snippet == "text of aa"
