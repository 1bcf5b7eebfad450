"""The reranker-training pieces that need no model: reading judgments, the held-out split,
and mining positives and hard negatives from retrieved candidates."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from retrieval.errors import RetrievalError
from retrieval.passage import Passage, ScoredPassage
from retrieval.rerank.training import load_judgments, mine_examples, split_judgments
from retrieval.rerank.training_data import Judgment, TrainingConfig


def _judgments(count: int) -> list[Judgment]:
    return [Judgment(f"q{i}", f"query {i}", frozenset({f"d{i}"})) for i in range(count)]


def test_held_out_split_is_disjoint_stable_and_about_the_fraction() -> None:
    judgments = _judgments(2000)
    split = split_judgments(judgments, TrainingConfig())
    held_out = {j.query_id for j in split.held_out}
    train = {j.query_id for j in split.train}
    dev = {j.query_id for j in split.dev}
    assert not held_out & train
    assert not held_out & dev
    assert not train & dev
    assert len(held_out) + len(train) + len(dev) == 2000
    assert 0.17 < len(held_out) / 2000 < 0.23
    assert 0.07 < len(dev) / (2000 - len(held_out)) < 0.13
    shuffled = judgments[:]
    random.Random(0).shuffle(shuffled)
    again = split_judgments(shuffled, TrainingConfig())
    assert {j.query_id for j in again.held_out} == held_out
    assert {j.query_id for j in again.train} == train


def test_capping_training_queries_never_moves_a_held_out_query() -> None:
    judgments = _judgments(500)
    full = split_judgments(judgments, TrainingConfig())
    capped = split_judgments(judgments, TrainingConfig(max_train_queries=30))
    assert capped.held_out == full.held_out
    assert len(capped.train) + len(capped.dev) == 30
    assert set(capped.train) <= set(full.train)


def test_loads_beir_queries_and_qrels(tmp_path: Path) -> None:
    queries = tmp_path / "queries.jsonl"
    queries.write_text(
        "\n".join(json.dumps({"_id": q, "text": f"text {q}"}) for q in ("1", "2", "3")) + "\n"
    )
    qrels = tmp_path / "qrels.tsv"
    qrels.write_text("query-id\tcorpus-id\tscore\n1\td1\t1\n1\td2\t1\n2\td3\t0\n")
    assert load_judgments(queries, qrels) == [Judgment("1", "text 1", frozenset({"d1", "d2"}))]
    qrels.write_text("query-id\tcorpus-id\tscore\n1\td1\tyes\n")
    with pytest.raises(RetrievalError, match=r"qrels\.tsv:2"):
        load_judgments(queries, qrels)


def _passage(passage_id: str) -> Passage:
    doc_id, position = passage_id.split("#")
    return Passage(passage_id, doc_id, int(position), f"T{doc_id}", f"text {passage_id}", 0, 9)


def test_mines_retrieved_positives_and_one_negative_per_other_document() -> None:
    retrieved = [
        ScoredPassage(_passage(p), 1.0) for p in ("n1#0", "n1#1", "r#1", "n2#0", "n3#0", "r#0")
    ]
    judgment = Judgment("q", "the query", frozenset({"r"}))
    [example] = mine_examples([judgment], {"q": retrieved}, {}, negatives_per_query=2)
    assert example.query == "the query"
    assert example.positives == ("Tr\ntext r#1", "Tr\ntext r#0")
    assert example.negatives == ("Tn1\ntext n1#0", "Tn2\ntext n2#0")


def test_falls_back_to_first_passages_and_skips_queries_without_any() -> None:
    retrieved = [ScoredPassage(_passage("n1#0"), 1.0)]
    found = Judgment("q", "found", frozenset({"r"}))
    missing = Judgment("m", "missing", frozenset({"gone"}))
    examples = mine_examples(
        [found, missing], {"q": retrieved, "m": retrieved}, {"r": _passage("r#0")}, 4
    )
    assert [(e.query, e.positives, e.negatives) for e in examples] == [
        ("found", ("Tr\ntext r#0",), ("Tn1\ntext n1#0",))
    ]


def test_a_passage_holding_an_answer_is_never_a_negative() -> None:
    """SQuAD's articles repeat their facts: a passage of another document that holds the
    answer string is left out of the negatives, and the relevant document's passages that hold
    it are the positives."""
    texts = {
        "r#0": "Ada wrote notes.",
        "r#1": "In 1843 Ada Lovelace published the first program.",
        "n1#0": "the first program appeared in 1843, by Lovelace.",
        "n2#0": "Babbage designed the engine.",
        "n3#0": "Menabrea wrote in French.",
    }
    retrieved = [
        ScoredPassage(Passage(p, p.split("#")[0], 0, "", text, 0, 9), 1.0)
        for p, text in texts.items()
    ]
    judgment = Judgment("q", "when?", frozenset({"r"}), answers=("1843",))
    [example] = mine_examples([judgment], {"q": retrieved}, {}, negatives_per_query=5)
    assert example.positives == ("In 1843 Ada Lovelace published the first program.",)
    assert example.negatives == ("Babbage designed the engine.", "Menabrea wrote in French.")


def test_capped_training_queries_spread_over_a_file_sorted_by_topic() -> None:
    """A cap takes queries from all over the file (SQuAD's is sorted by article), not its head."""
    judgments = _judgments(2000)
    capped = split_judgments(judgments, TrainingConfig(max_train_queries=100))
    positions = sorted(int(j.query_id[1:]) for j in capped.train + capped.dev)
    assert positions[0] < 200
    assert positions[-1] > 1800
    held = split_judgments(judgments, TrainingConfig(max_held_out_queries=50))
    assert len(held.held_out) == 50
