"""A quoted answer: one to three sentences of the retrieved passages, picked by the scorer's
probability, kept readable and short.

The best sentence always goes first (unless nothing reaches `min_probability`: then there is no
quote, and the caller says it does not know). A sentence that leans on the one before it ("It",
"They", "This ...") brings that one along; a short best sentence brings the one after it when
that one leans back on it ("PostgreSQL can build an index without locking out writes. This
method is invoked by specifying CONCURRENTLY."). A further sentence joins when the scorer's
chance that it is the one that answers (a softmax of the scores over the quotable sentences,
what the scorer was trained on) pays for its length: at least `words_weight` per word. So a
short sentence nearly as likely as the best joins, a long one must be likelier, and a question
whose best sentence is clear gets that sentence alone; a sentence that leads into what follows
it ("... as follows:") never joins. A quote is never longer than `max_words` (a longer single
sentence is cut at a clause around what the question asks). Code blocks, headings and fragments
of sentences are not quoted. A sentence of a definition (a manual's "max_connections (integer)"
and the paragraph below it: `splitter.definition_terms`) is quoted after the term it defines,
once per paragraph.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from retrieval.errors import RetrievalError
from retrieval.passage import Passage
from retrieval.sentences.scorer import ScoredSentence, weights_file_text
from retrieval.sentences.terms import content_terms

_LEANS_BACK = re.compile(
    r"^(it|its|they|their|them|this|these|those|that|he|his|she|her|such|there|here|"
    r"the latter|the former|both|also|however|thus|therefore|then)\b",
    re.I,
)


@dataclass(frozen=True, slots=True)
class QuoteConfig:
    min_probability: float = 0.1
    # The chance per word a further sentence must bring to join (see the module's docstring).
    words_weight: float = 0.008
    max_sentences: int = 3
    max_words: int = 80
    min_words: int = 4
    # A best sentence and the one after it that leans back on it, together at most this long.
    follow_words: int = 40


@dataclass(frozen=True, slots=True)
class QuotedSentence:
    text: str
    passage: Passage
    # The passage's place in the retrieved order (0: the best): its source number is rank + 1.
    rank: int
    probability: float
    # The term of the definition it is from, put before it in `text` ("" for none).
    term: str = ""

    @property
    def sentence(self) -> str:
        """The quoted sentence without its term."""
        return self.text.removeprefix(f"{self.term}: ") if self.term else self.text


def select_quote(
    scored: Sequence[ScoredSentence], config: QuoteConfig, question: str = ""
) -> list[QuotedSentence]:
    usable = [s for s in scored if _quotable(s, config)]
    if not usable or usable[0].probability < config.min_probability:
        return []
    best = usable[0]
    picked = _with_follow_on(_with_lead_in(best, scored), best, scored, config)
    words = sum(len(s.text.split()) for s in picked)
    for other, chance in zip(usable[1:], _chances(usable)[1:], strict=True):
        if len(picked) >= config.max_sentences:
            break
        if any(_same(other, p) for p in picked) or _leads_on(other):
            continue
        quoted = _quoted(other, picked)
        extra = len(quoted.text.split())
        if chance < config.words_weight * extra or words + extra > config.max_words:
            continue
        picked.append(quoted)
        words += extra
    return _bounded(picked, config.max_words, question)


def _chances(usable: Sequence[ScoredSentence]) -> list[float]:
    """A softmax of the scores: the scorer's chance that each sentence is the one that answers."""
    top = max(s.score for s in usable)
    weights = [math.exp(s.score - top) for s in usable]
    total = sum(weights)
    return [w / total for w in weights]


def _quotable(sentence: ScoredSentence, config: QuoteConfig) -> bool:
    ref = sentence.candidate.ref
    return (
        ref.whole
        and ref.kind != "code"
        # Its term counts: "fillfactor (integer): Default is 100." says something whole.
        and len(sentence.candidate.with_term.split()) >= config.min_words
    )


def _leads_on(sentence: ScoredSentence) -> bool:
    """A sentence that leads into what follows it ("To add a column, use:"), a code block or a
    list a quote does not carry: it may answer as the best, but adds nothing as a further one."""
    return sentence.candidate.text.rstrip().endswith(":")


def _quoted(sentence: ScoredSentence, before: Sequence[QuotedSentence] = ()) -> QuotedSentence:
    """The sentence as quoted: after the term it defines (a definition's sentences leave out
    what they are about), unless a sentence quoted before it already carries that term."""
    c = sentence.candidate
    text = _readable(c.text)
    term = c.term
    if any(q.passage.doc_id == c.passage.doc_id and q.term == term for q in before):
        term = ""
    return QuotedSentence(
        f"{term}: {text}" if term else text, c.passage, c.rank, sentence.probability, term
    )


def _readable(text: str) -> str:
    """A prose sentence on one line: a manual's wrapped lines become single spaces."""
    return " ".join(text.split())


def _same(sentence: ScoredSentence, quoted: QuotedSentence) -> bool:
    return _readable(sentence.candidate.text) == quoted.sentence


def _with_lead_in(best: ScoredSentence, scored: Sequence[ScoredSentence]) -> list[QuotedSentence]:
    """The best sentence, after the one before it in its passage when it leans on it."""
    quoted = _quoted(best)
    if not _LEANS_BACK.match(best.candidate.text) or best.candidate.ref.position == 0:
        return [quoted]
    ref = best.candidate.ref
    before = next(
        (
            s
            for s in scored
            if s.candidate.ref.row == ref.row and s.candidate.ref.position == ref.position - 1
        ),
        None,
    )
    if before is None or before.candidate.ref.kind == "code" or not before.candidate.ref.whole:
        return [quoted]  # no sentence to lean on: a window's cut fragment, a heading, code
    lead = dataclasses.replace(_quoted(before), probability=quoted.probability)
    return [lead, _quoted(best, [lead])]


def _with_follow_on(
    picked: list[QuotedSentence],
    best: ScoredSentence,
    scored: Sequence[ScoredSentence],
    config: QuoteConfig,
) -> list[QuotedSentence]:
    """The quote so far, and the sentence after the best when it leans back on it and fits."""
    ref = best.candidate.ref
    after = next(
        (
            s
            for s in scored
            if s.candidate.ref.row == ref.row and s.candidate.ref.position == ref.position + 1
        ),
        None,
    )
    if after is None or after.candidate.ref.kind == "code" or not after.candidate.ref.whole:
        return picked
    if not _LEANS_BACK.match(after.candidate.text):
        return picked
    words = sum(len(p.text.split()) for p in picked) + len(after.candidate.text.split())
    if words > config.follow_words:
        return picked
    quoted = picked[-1]
    return [
        *picked,
        QuotedSentence(
            _readable(after.candidate.text), quoted.passage, quoted.rank, quoted.probability
        ),
    ]


def _bounded(picked: list[QuotedSentence], max_words: int, question: str) -> list[QuotedSentence]:
    """At most `max_words`: drop trailing sentences, then cut a long one around the question's
    words at clause boundaries."""
    while len(picked) > 1 and sum(len(p.text.split()) for p in picked) > max_words:
        picked.pop()
    if sum(len(p.text.split()) for p in picked) <= max_words:
        return picked
    only = picked[-1] if len(picked) == 1 else picked[0]
    return [
        QuotedSentence(
            _cut(only.text, max_words, question), only.passage, only.rank, only.probability
        )
    ]


def _cut(text: str, max_words: int, question: str) -> str:
    """The window of `text` that holds most of the question's terms, those terms as near its
    middle as they can be (what answers is usually next to what was asked), marked with
    ellipses where it was cut; with the ellipses at most `max_words` words."""
    words = text.split()
    asked = content_terms(question)
    hits = [(i, found) for i, word in enumerate(words) if (found := content_terms(word) & asked)]
    # The ellipses count as words of the quote: one at the end, one at the start when the
    # window does not begin the sentence.
    size = max_words - 2
    best_start, best = 0, (-1, 0.0)
    for start in range(0, max(len(words) - size, 0) + 1):
        inside = [(i, found) for i, found in hits if start <= i < start + size]
        terms = len(frozenset().union(*(found for _, found in inside)))
        middle = (inside[0][0] + inside[-1][0]) / 2 if inside else start
        # The most distinct terms asked for (a term said three times is still one), centred.
        rank = (terms, -abs(middle - (start + size / 2)))
        if rank > best:
            best_start, best = start, rank
    if best_start == 0:  # from the sentence's start: only the closing ellipsis
        size += 1
    clipped = " ".join(words[best_start : best_start + size])
    return ("… " if best_start > 0 else "") + clipped + " …"


def read_quote_config(path: Path | None = None) -> QuoteConfig:
    """The quote selection calibrated with the scorer (the `quote` object of its weights file;
    the package's own by default)."""
    try:
        text = weights_file_text(path)
        return QuoteConfig(**json.loads(text)["quote"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise RetrievalError(f"cannot read the quote selection: {exc}") from exc
