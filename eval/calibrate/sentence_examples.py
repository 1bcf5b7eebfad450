"""The sentence scorer's examples: each SQuAD question of a part of the committed split,
retrieved for as the service retrieves (hybrid), its candidate sentences with their features
and labels (whether each holds a gold answer string). Shared by the scorer
(`sentence_scorer.py`) and the reader's example file (`sentence_reader.py examples`), so
neither imports the other."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from budget import Deadline
from eval.commands.main import index_of
from eval.lib.data import SQUAD_DIR, Part, shared, squad_part_of
from eval.lib.metrics import answer_recall
from eval.lib.questions import Question, read_questions
from retrieval.embedder import EmbedderConfig, SentenceTransformerEmbedder
from retrieval.retriever import Retriever
from retrieval.sentences.scorer import Candidate, ScorerWeights, candidates, feature_matrix


@dataclass(frozen=True, slots=True)
class Example:
    """One question's candidates, their features and labels."""

    question: Question
    found: list[Candidate]
    features: npt.NDArray[np.float64]
    labels: npt.NDArray[np.float64]


async def examples_of(
    retriever: Retriever, questions: Sequence[Question], top_k: int, leave_out_gold: bool = False
) -> list[Example]:
    """Each question's retrieved candidates; with `leave_out_gold` as if its own gold document
    were not in the index (what a question the corpus cannot answer looks like, while the rest
    of its article, which it resembles most, stays)."""
    store = retriever.index.sentences
    out = []
    extra = 3 if leave_out_gold else 0
    for question in questions:
        deadline = Deadline.after_ms(60_000)
        retrieved = await retriever.retrieve(
            question.question, top_k + extra, deadline, mode="hybrid", embed=True
        )
        hits, vector = retrieved.passages, retrieved.vector
        assert vector is not None
        if leave_out_gold:
            hits = [h for h in hits if h.passage.doc_id != question.gold_passage_id][:top_k]
        rows = [(retriever.index.row_of(h.passage.passage_id), h.passage) for h in hits]
        found = candidates(store, rows, retriever.index.passage)
        features = feature_matrix(question.question, vector, found, store)
        labels = np.asarray(
            [answer_recall(c.text, question.answers) for c in found], dtype=np.float64
        )
        out.append(Example(question, found, features, labels))
    return out


def retriever_for(corpus: Path) -> Retriever:
    embedder = SentenceTransformerEmbedder(EmbedderConfig())
    # The examples need only the features; the weights are what this command learns.
    return Retriever.open(
        index_of(corpus, None, embedder), embedder, scorer=ScorerWeights.untrained()
    )


def part_questions(part: Part) -> list[Question]:
    return [
        q
        for q in read_questions(shared(SQUAD_DIR / "questions.jsonl"))
        if q.gold_passage_id and squad_part_of(q.gold_passage_id) == part
    ]
