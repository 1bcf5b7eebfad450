"""Citations the service attributes itself, not trusted from the model.

A finished answer sentence cites the prompt passages that cover at least `support_threshold` of
its content terms (lower-cased words, minus English stopwords, Snowball-stemmed;
retrieval/sentences/terms.py), best first, at most `max_sources`; a sentence that none covers is
unsupported. A code block is neither: it gets no citation and no marker. The threshold was
measured on SQuAD, not guessed: `answer-eval calibrate-citations` (eval/calibrate/citations.py,
eval/results/citation-thresholds.json), which also measured `evidence`, the passage-coverage
check abstention used before the sentence scorer's probability replaced it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from retrieval.sentences.splitter import SentenceSpan, split_sentences
from retrieval.sentences.terms import content_terms, coverage

# Measured by `answer-eval calibrate-citations` on SQuAD v1.1 dev (eval/results/
# citation-thresholds.json); the service's, not a setting (issue 39).
SUPPORT_THRESHOLD = 0.63
ABSTAIN_BELOW = 0.5
ABSTENTION = (
    "I do not know: none of the retrieved passages covers this question well enough to answer "
    "it. The closest sources are listed."
)

_MARKER = re.compile(r"[ \t]*\[\d{1,3}\]")
_INLINE_CODE = re.compile(r"`[^`\n]*`")

__all__ = [
    "ABSTAIN_BELOW",
    "ABSTENTION",
    "SUPPORT_THRESHOLD",
    "Attributor",
    "Citation",
    "content_terms",
    "coverage",
    "evidence",
    "with_markers",
]


def evidence(query: str, passages: Sequence[str]) -> float:
    """How well the best passage covers the question's terms (0..1)."""
    terms = content_terms(query)
    return max((coverage(terms, content_terms(p)) for p in passages), default=0.0)


@dataclass(frozen=True, slots=True)
class Citation:
    """Sentence `sentence` (answer[start:end]) and the source numbers that support it."""

    sentence: int
    start: int
    end: int
    sources: tuple[int, ...]
    score: float
    supported: bool


class Attributor:
    def __init__(
        self,
        passages: Sequence[tuple[int, str]],
        *,
        threshold: float = SUPPORT_THRESHOLD,
        max_sources: int = 2,
    ) -> None:
        """`passages`: (source number, text) of each passage the prompt held."""
        self._passages = [(number, content_terms(text)) for number, text in passages]
        self.threshold = threshold
        self.max_sources = max_sources
        self._count = 0

    def cite(self, span: SentenceSpan, text: str) -> Citation | None:
        """The citation of the finished sentence `text` (answer[span.start:span.end]); None for
        a code block, which is quoted material, not a claim."""
        if span.kind == "code":
            return None
        terms = content_terms(text)
        scored = sorted(
            ((coverage(terms, p_terms), number) for number, p_terms in self._passages),
            key=lambda pair: (-pair[0], pair[1]),
        )
        best = scored[0][0] if scored else 0.0
        sources = tuple(n for score, n in scored if score >= self.threshold)[: self.max_sources]
        citation = Citation(
            self._count, span.start, span.end, sources, round(best, 4), bool(sources)
        )
        self._count += 1
        return citation


def with_markers(answer: str, citations: Sequence[Citation]) -> str:
    """The answer with ` [n]` right after each supported sentence's closing punctuation (a
    citation's end). The model's own markers are dropped, since they were not checked, except
    inside code, which is left as written. Code blocks have no citation, so no marker lands in
    one, and a sentence never ends inside inline code."""
    code = _code_ranges(answer)
    kept = [
        (m.start(), m.end())
        for m in _MARKER.finditer(answer)
        if not any(a <= m.start() < b for a, b in code)
    ]
    inserts = {c.end: "".join(f" [{n}]" for n in c.sources) for c in citations if c.sources}
    parts: list[str] = []
    at = 0
    for cut in sorted({*inserts, *(start for start, _ in kept)}):
        parts.append(answer[at:cut])
        at = cut
        if cut in inserts:
            parts.append(inserts[cut])
        for start, end in kept:
            if start == cut:
                at = max(at, end)
    parts.append(answer[at:])
    return "".join(parts)


def _code_ranges(text: str) -> list[tuple[int, int]]:
    blocks = [(s.start, s.end) for s in split_sentences(text) if s.kind == "code"]
    inline = [(m.start(), m.end()) for m in _INLINE_CODE.finditer(text)]
    return blocks + inline
