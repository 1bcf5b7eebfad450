"""How likely each sentence of the retrieved passages is to answer the question: a logistic model
over features of the sentence, the question and the passage it sits in.

Features: the embedder's cosine of sentence and question (stored sentence vectors, no model call
per request) and its margin to the best candidate; the IDF-weighted share of the question's
terms the sentence holds, alone and with its neighbours, its margin to the best candidate and
to the best of its own passage, and its rank; the question's word pairs and unstemmed words it
repeats, whether it holds the question's rarest term, and how spread out the matches are; what
is new in it (not the question's words); the passage's rank and how much of the question the
passage and its title hold; the sentence's place and length, whether it is whole, code or a
list item; whether it holds the kind of thing the question asks for (a number for "how
many", a year or a date for "when", a name the question does not use for "who" or "where");
and the same question coverage weighted by how rare each term is among this question's
candidates rather than in the corpus (`local_*`): retrieved passages mostly share the
question's topic words ("Super Bowl 50"), so what tells the answering sentence apart is the
term few of them hold ("sacked"). Alone, with neighbours, against the best, its rank, and the
densest window of the sentence's terms.

The weights rank the candidates of a question against each other (a conditional logit, so the
best sentence is what it learns to find) and a one-variable logistic turns the score into the
probability that the sentence answers, for abstention. Both are learned by
`python -m eval.calibrate.sentence_scorer` on the scorer-training part of the committed split
and shipped with the package (scorer.json).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Literal

import numpy as np
import numpy.typing as npt

from retrieval.embedder import Vectors
from retrieval.errors import RetrievalError
from retrieval.passage import Passage
from retrieval.sentences.splitter import (
    SentenceSpan,
    definition_terms,
    ends_as_sentence,
    navigation_blocks,
    paragraph_start,
    starts_as_sentence,
)
from retrieval.sentences.store import (
    SentenceRef,
    SentenceStore,
    ends_cut,
    section_break,
    starts_cut,
)
from retrieval.sentences.terms import Idf, content_terms, term_list

FEATURES = (
    "bias",
    "cos",
    "cos_margin",
    "cover",
    "cover_margin",
    "cover_context",
    "novel",
    "passage_rank",
    "passage_cover",
    "title_cover",
    "first",
    "position",
    "log_words",
    "short",
    "long",
    "fragment",
    "code",
    "item",
    "number_asked",
    "time_asked",
    "name_asked",
    "bigrams",
    "exact_words",
    "cover_rank",
    "cover_in_passage",
    "rarest_term",
    "spread",
    "new_terms",
    "local_cover",
    "local_margin",
    "local_rank",
    "local_context",
    "local_window",
)
# Terms in the window `local_window` slides over a sentence.
_WINDOW_TERMS = 8

_NUMBER_Q = re.compile(
    r"\b(how (many|much|long|old|far|big|large|tall|high|often)|what (number|percent|"
    r"percentage|amount|fraction|proportion|size|age)|how fast)\b",
    re.I,
)
_TIME_Q = re.compile(r"\b(when|what (year|date|time|day|month|century|decade|period|era))\b", re.I)
_NAME_Q = re.compile(r"\b(who|whom|whose|where|which (person|city|country|team|company))\b", re.I)
_NUMBER = re.compile(
    r"\d|\b(one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|twenty|thirty|"
    r"forty|fifty|hundred|thousand|million|billion|dozen|half|once|twice)\b",
    re.I,
)
_YEAR = re.compile(
    r"\b(1\d{3}|20\d{2})\b|\b(January|February|March|April|May|June|July|August|September|"
    r"October|November|December)\b|\b\d{1,2}(st|nd|rd|th) century\b"
)
_CAPITALIZED = re.compile(r"(?<![.!?]\s)(?<!^)\b[A-Z][a-z]+")
_WORDS = re.compile(r"[A-Za-z0-9]+")


def weights_file_text(path: Path | None = None) -> str:
    """The scorer's weights file (`path`, or the one shipped with the package): the weights,
    the quote's selection, the answerable model and the reader's mix, learned together by
    `python -m eval.calibrate.sentence_scorer`. Raises OSError."""
    if path is not None:
        return path.read_text(encoding="utf-8")
    return resources.files("retrieval.sentences").joinpath("scorer.json").read_text()


@dataclass(frozen=True, slots=True)
class ScorerWeights:
    names: tuple[str, ...]
    weights: tuple[float, ...]
    # Features are standardised (x - mean) / scale before the weights apply.
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    # The probability that a sentence answers: sigmoid(slope * score + intercept).
    slope: float = 1.0
    intercept: float = 0.0

    def __post_init__(self) -> None:
        if not len(self.names) == len(self.weights) == len(self.mean) == len(self.scale):
            raise ValueError("one weight, mean and scale per feature")
        if self.names != FEATURES:
            raise ValueError(f"weights for features {self.names}, the scorer has {FEATURES}")

    @classmethod
    def untrained(cls) -> ScorerWeights:
        """Zero weights for today's features: what the command that learns them opens an index
        with (the shipped weights may be for other features)."""
        n = len(FEATURES)
        return cls(FEATURES, (0.0,) * n, (0.0,) * n, (1.0,) * n)

    @classmethod
    def read(cls, path: Path | None = None) -> ScorerWeights:
        """The weights in `path`, or the ones shipped with the package."""
        try:
            text = weights_file_text(path)
            raw = json.loads(text)
            calibration = raw.get("calibration", {"slope": 1.0, "intercept": 0.0})
            return cls(
                tuple(raw["features"]),
                tuple(float(w) for w in raw["weights"]),
                tuple(float(m) for m in raw["mean"]),
                tuple(float(s) for s in raw["scale"]),
                float(calibration["slope"]),
                float(calibration["intercept"]),
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise RetrievalError(f"cannot read sentence scorer weights: {exc}") from exc

    def to_json(self) -> dict[str, object]:
        return {
            "features": list(self.names),
            "weights": list(self.weights),
            "mean": list(self.mean),
            "scale": list(self.scale),
            "calibration": {"slope": self.slope, "intercept": self.intercept},
        }


@dataclass(frozen=True, slots=True)
class Candidate:
    """A sentence of a retrieved passage; `rank` is the passage's (0: the best)."""

    ref: SentenceRef
    passage: Passage
    rank: int
    # The term its paragraph defines, where it is a definition's (`definition_terms`), else "".
    term: str = ""
    # Where the window cuts the sentence, the parts of it in the windows before and after
    # (`candidates`), so that it reads whole.
    head: str = ""
    tail: str = ""

    @property
    def text(self) -> str:
        return self.head + self.passage.text[self.ref.start : self.ref.end] + self.tail

    @property
    def with_term(self) -> str:
        """The sentence as a reader takes it: after the term it defines, where it has one
        ("max_connections (integer): Determines the maximum number of ...")."""
        return f"{self.term}: {self.text}" if self.term else self.text


@dataclass(frozen=True, slots=True)
class ScoredSentence:
    candidate: Candidate
    probability: float
    # Its row of `FEATURES` (what the answerable model reads of the best sentence).
    features: npt.NDArray[np.float64] | None = field(default=None, compare=False, repr=False)
    # The model's ranking score before calibration: a softmax of the scores over one question's
    # candidates is the model's chance that each is the one that answers (how it was trained).
    score: float = 0.0


def best_probabilities(sentences: Sequence[ScoredSentence], n: int) -> list[float]:
    """The `n` best probabilities among the sentences that can be quoted (ranked best first),
    padded with zeros."""
    found = [s.probability for s in sentences if s.candidate.ref.whole][:n]
    return found + [0.0] * (n - len(found))


def candidates(
    store: SentenceStore,
    passages: Sequence[tuple[int, Passage]],
    passage_at: Callable[[int], Passage] | None = None,
) -> list[Candidate]:
    """Every sentence of the retrieved passages (index row, passage; best first). A prose
    unit that does not end as a sentence does (a heading, a label, a page's navigation line),
    or starts as the rest of one ("but then ..." after an example), or is a line of a table
    of contents or a page's footer, is not whole: it is scored but never quoted. A sentence of
    a definition carries its term.

    `passage_at` (the index's passage of a row) gives each window's neighbours in its
    document: a sentence the window cuts is read whole with its missing part from the window
    before or after (the windows overlap), and a term line the window starts inside is read
    from its start. Without it such a sentence is a fragment and the line no term."""
    windows = None if passage_at is None else _Windows(store, passage_at)
    found = []
    for rank, (row, passage) in enumerate(passages):
        refs = store.of(row)
        spans = [SentenceSpan(ref.start, ref.end, ref.kind) for ref in refs]
        before = None if windows is None else windows.at(row, passage, -1)
        starts = passage.position == 0 or (before is not None and section_break(before, passage))
        head = "" if starts else _paragraph_head(passage, before)
        lead = "" if starts else _block_before(passage, before, head)
        terms = definition_terms(passage.text, spans, head=head, lead=lead)
        navigation = navigation_blocks(passage.text)
        for ref, term in zip(refs, terms, strict=True):
            candidate = Candidate(ref, passage, rank, term)
            if windows is not None and not ref.whole and ref.kind == "prose":
                candidate = windows.completed(candidate, len(refs), before)
            found.append(_as_found(candidate, navigation))
    return found


@dataclass(frozen=True, slots=True)
class _Windows:
    """The index's windows around a retrieved one: its rows hold each document's windows in
    order, so the same document's window before or after a row is the row before or after."""

    store: SentenceStore
    passage_at: Callable[[int], Passage]

    def at(self, row: int, passage: Passage, step: int) -> Passage | None:
        other_row = row + step
        if not 0 <= other_row < self.store.passages:
            return None
        other = self.passage_at(other_row)
        if other.doc_id != passage.doc_id or other.position != passage.position + step:
            return None
        return other

    def completed(self, candidate: Candidate, count: int, before: Passage | None) -> Candidate:
        """A sentence the window cuts, whole: the part the window starts after from the
        window before, the part it ends before from the window after (each where that
        window holds the sentence's start or end); else the fragment as it is."""
        ref, passage = candidate.ref, candidate.passage
        start = passage.start_char + ref.start  # in the document
        end = passage.start_char + ref.end
        head = tail = ""
        if starts_cut(passage, ref.start, ref.position):
            head = "" if before is None else self._piece(ref.row - 1, before, start, "head")
            if not head:
                return candidate
        if ends_cut(passage, ref.end, ref.position, count):
            after = self.at(ref.row, passage, 1)
            tail = "" if after is None else self._piece(ref.row + 1, after, end, "tail")
            if not tail:
                return candidate
        if not head and not tail:
            return candidate
        whole = dataclasses.replace(ref, whole=True)
        return dataclasses.replace(candidate, ref=whole, head=head, tail=tail)

    def _piece(self, row: int, window: Passage, at: int, side: Literal["head", "tail"]) -> str:
        """The part of the sentence that holds document offset `at` lying in `window` before
        `at` (its head) or after it (its tail), or "" where `window` does not hold that part
        whole (its sentence is cut there too, or `at` falls between its sentences) or shows
        it is no sentence."""
        local = at - window.start_char
        refs = self.store.of(row)
        for ref in refs:
            if not ref.start < local < ref.end:
                continue
            if ref.kind != "prose" or any(
                s <= ref.start < e for s, e in navigation_blocks(window.text)
            ):
                return ""  # a table of contents' or a footer's line there, seen whole
            if side == "head":
                cut = starts_cut(window, ref.start, ref.position)
                return "" if cut else window.text[ref.start : local]
            cut = ends_cut(window, ref.end, ref.position, len(refs))
            return "" if cut else window.text[local : ref.end]
        return ""


def _paragraph_head(passage: Passage, before: Passage | None) -> str | None:
    """What of the paragraph a window starts inside lies in the window before it; None where
    the paragraph starts before that window or it is not known."""
    if before is None:
        return None
    offset = passage.start_char - before.start_char
    if not 0 < offset <= len(before.text):
        return None
    start = paragraph_start(before.text, offset)
    return None if start is None else before.text[start:offset]


def _block_before(passage: Passage, before: Passage | None, head: str | None) -> str:
    """The block (after a blank line) of the window before that ends where the paragraph a
    window starts in (`head` of it before the window) or at starts, or "" where that is not
    known or it starts before that window."""
    if before is None or head is None:
        return ""
    offset = passage.start_char - before.start_char - len(head)
    if not 0 < offset <= len(before.text):
        return ""
    prior = before.text[:offset].rstrip()
    start = paragraph_start(prior, len(prior))
    return "" if start is None else prior[start:]


def _as_found(candidate: Candidate, navigation: Sequence[tuple[int, int]]) -> Candidate:
    """The candidate, no longer whole where its text shows it is no sentence."""
    ref = candidate.ref
    if not ref.whole:
        return candidate
    no_sentence = any(start <= ref.start < end for start, end in navigation)
    if ref.kind == "prose":
        text = candidate.text
        no_sentence = no_sentence or not ends_as_sentence(text) or not starts_as_sentence(text)
    if no_sentence:
        return dataclasses.replace(candidate, ref=dataclasses.replace(ref, whole=False))
    return candidate


def feature_matrix(
    question: str,
    vector: Vectors,
    found: Sequence[Candidate],
    store: SentenceStore,
) -> npt.NDArray[np.float64]:
    """One row of `FEATURES` per candidate."""
    if not found:
        return np.zeros((0, len(FEATURES)))
    idf = store.idf
    asked = content_terms(question)
    cosines = _cosines(vector, found, store)
    # What a sentence says, with the term it defines where it has one: "The default is five
    # minutes." says it of checkpoint_timeout.
    texts = [c.with_term for c in found]
    terms = [content_terms(text) for text in texts]
    covers = [idf.weighted_coverage(asked, t) for t in terms]
    number_q = bool(_NUMBER_Q.search(question))
    time_q = bool(_TIME_Q.search(question))
    name_q = bool(_NAME_Q.search(question))
    question_words = {w.lower() for w in re.findall(r"[A-Za-z]+", question)}
    passage_cover = _passage_covers(asked, found, idf)
    lists = [term_list(text) for text in texts]
    asked_list = term_list(question)
    pairs = set(itertools.pairwise(asked_list))
    rarest = max(asked, key=idf.weight) if asked else None
    asked_words = {w.lower() for w in _WORDS.findall(question) if len(w) > 2}
    order = np.argsort(-np.asarray(covers), kind="stable")
    cover_rank = np.empty(len(covers))
    cover_rank[order] = np.arange(len(covers))
    best_in_passage: dict[int, float] = {}
    for candidate, cover in zip(found, covers, strict=True):
        best_in_passage[candidate.ref.row] = max(best_in_passage.get(candidate.ref.row, 0.0), cover)
    local = _LocalCover(asked, lists)
    rows = []
    best_cos, best_cover = max(cosines), max(covers)
    for i, (candidate, sentence_terms) in enumerate(zip(found, terms, strict=True)):
        in_order = lists[i]
        hits = [j for j, term in enumerate(in_order) if term in asked]
        text = texts[i]
        said = {w.lower() for w in _WORDS.findall(text)}
        words = len(text.split())
        context = sentence_terms | _neighbour_terms(found, i)
        sentence_count = int(
            store.offsets[candidate.ref.row + 1] - store.offsets[candidate.ref.row]
        )
        names = {w.lower() for w in _CAPITALIZED.findall(text)} - question_words
        rows.append(
            (
                1.0,
                cosines[i],
                cosines[i] - best_cos,
                covers[i],
                covers[i] - best_cover,
                idf.weighted_coverage(asked, context),
                len(sentence_terms - asked) / len(sentence_terms) if sentence_terms else 0.0,
                1.0 / (1.0 + candidate.rank),
                passage_cover[candidate.rank],
                idf.weighted_coverage(asked, content_terms(candidate.passage.title)),
                float(candidate.ref.position == 0),
                candidate.ref.position / max(sentence_count - 1, 1),
                math.log1p(words),
                float(words < 6),
                float(words > 60),
                float(not candidate.ref.whole),
                float(candidate.ref.kind == "code"),
                float(candidate.ref.kind == "item"),
                float(number_q and bool(_NUMBER.search(text))),
                float(time_q and bool(_YEAR.search(text))),
                float(name_q and bool(names)),
                len(pairs & set(itertools.pairwise(in_order))) / len(pairs) if pairs else 0.0,
                len(asked_words & said) / len(asked_words) if asked_words else 0.0,
                1.0 / (1.0 + cover_rank[i]),
                covers[i] - best_in_passage[candidate.ref.row],
                float(rarest is not None and rarest in sentence_terms),
                (hits[-1] - hits[0] + 1) / len(in_order) if len(hits) > 1 else 1.0,
                min(len(set(in_order) - asked), 20) / 20.0,
                local.covers[i],
                local.covers[i] - local.best,
                1.0 / (1.0 + local.ranks[i]),
                local.of(context),
                local.window(in_order),
            )
        )
    return np.asarray(rows, dtype=np.float64)


class _LocalCover:
    """The question's terms weighted by how few of its candidate sentences hold each (IDF over
    the candidates, not the corpus), and each candidate's share of that weight."""

    def __init__(self, asked: frozenset[str], lists: Sequence[Sequence[str]]) -> None:
        held = [frozenset(terms) for terms in lists]
        n = len(held)
        self._weights: dict[str, float] = {}
        for term in asked:
            seen = sum(term in terms for terms in held)
            self._weights[term] = math.log(1.0 + (n - seen + 0.5) / (seen + 0.5))
        self._total = sum(self._weights.values())
        self.covers = [self.of(terms) for terms in held]
        self.best = max(self.covers, default=0.0)
        order = np.argsort(-np.asarray(self.covers), kind="stable")
        self.ranks = np.empty(n)
        self.ranks[order] = np.arange(n)

    def of(self, terms: frozenset[str] | set[str]) -> float:
        if not self._total:
            return 0.0
        return sum(w for t, w in self._weights.items() if t in terms) / self._total

    def window(self, in_order: Sequence[str]) -> float:
        """The largest share held by `_WINDOW_TERMS` consecutive terms of the sentence."""
        if not self._total:
            return 0.0
        starts = range(max(len(in_order) - _WINDOW_TERMS + 1, 1))
        return max(self.of(set(in_order[a : a + _WINDOW_TERMS])) for a in starts)


def _cosines(vector: Vectors, found: Sequence[Candidate], store: SentenceStore) -> list[float]:
    ids = np.asarray([c.ref.sentence_id for c in found], dtype=np.int64)
    sentence_vectors = np.asarray(store.vectors[ids], dtype=np.float32)
    return [float(v) for v in sentence_vectors @ np.asarray(vector, np.float32).reshape(-1)]


def _neighbour_terms(found: Sequence[Candidate], i: int) -> frozenset[str]:
    near: set[str] = set()
    for j in (i - 1, i + 1):
        if 0 <= j < len(found) and found[j].ref.row == found[i].ref.row:
            near |= content_terms(found[j].with_term)
    return frozenset(near)


def _passage_covers(asked: frozenset[str], found: Sequence[Candidate], idf: Idf) -> list[float]:
    ranks = max(c.rank for c in found) + 1
    covers = [0.0] * ranks
    seen: set[int] = set()
    for c in found:
        if c.rank not in seen:
            seen.add(c.rank)
            text = f"{c.passage.title}\n{c.passage.text}"
            covers[c.rank] = idf.weighted_coverage(asked, content_terms(text))
    return covers


class SentenceModel:
    """The logistic model alone: features in, probabilities out."""

    def __init__(self, weights: ScorerWeights) -> None:
        self._weights = np.asarray(weights.weights)
        self._mean = np.asarray(weights.mean)
        self._scale = np.asarray(weights.scale)
        self._slope = weights.slope
        self._intercept = weights.intercept

    def scores(self, features: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """The ranking score of each candidate (higher: more likely the answer)."""
        return np.asarray(((features - self._mean) / self._scale) @ self._weights, np.float64)

    def probabilities(self, features: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        return self._calibrated(self.scores(features))

    def _calibrated(self, scores: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        z = self._slope * scores + self._intercept
        return np.asarray(1.0 / (1.0 + np.exp(-np.clip(z, -30.0, 30.0))), dtype=np.float64)

    def rank(
        self, found: Sequence[Candidate], features: npt.NDArray[np.float64]
    ) -> list[ScoredSentence]:
        if not found:
            return []
        scores = self.scores(features)
        probabilities = self._calibrated(scores)
        order = np.argsort(-probabilities, kind="stable")
        return [
            ScoredSentence(found[i], float(probabilities[i]), features[i], float(scores[i]))
            for i in order
        ]


class SentenceScorer:
    def __init__(
        self,
        store: SentenceStore,
        weights: ScorerWeights,
        passage_at: Callable[[int], Passage] | None = None,
    ) -> None:
        self._store = store
        self._passage_at = passage_at
        self.model = SentenceModel(weights)

    def score(
        self, question: str, vector: Vectors, passages: Sequence[tuple[int, Passage]]
    ) -> list[ScoredSentence]:
        """The sentences of `passages` (index row, passage; best first), most likely to
        answer first. Blocking (a few milliseconds for five passages)."""
        found = candidates(self._store, passages, self._passage_at)
        return self.model.rank(found, feature_matrix(question, vector, found, self._store))
