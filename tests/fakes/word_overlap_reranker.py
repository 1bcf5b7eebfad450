"""A reranker honouring `Reranker` (retrieval/rerank/base.py): a passage scores the query words
it shares. Deterministic and instant, for tests of what the pipeline does with a rerank."""

from __future__ import annotations

import re

from retrieval.passage import ScoredPassage
from retrieval.rerank.base import RerankRequest


class WordOverlapReranker:
    @property
    def name(self) -> str:
        return "test/word-overlap"

    def warm_up(self) -> None:
        pass

    def rerank(self, request: RerankRequest) -> list[ScoredPassage]:
        words = set(re.findall(r"\w+", request.query.lower()))
        scored = [
            ScoredPassage(
                c.passage, float(len(words & set(re.findall(r"\w+", c.passage.text.lower()))))
            )
            for c in request.candidates
        ]
        return sorted(scored, key=lambda p: -p.score)[: request.top_n]
