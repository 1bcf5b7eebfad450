"""A follow-up question made standalone before it is searched, without a model.

"What lock does it take?" after "Which command reclaims the space of dead rows?" is searched as
the follow-up with the earlier user turns' salient words carried after it: the follow-up is
kept as it was written, and each carried word is one the follow-up does not already hold,
chosen by its weight, the index's inverse document frequency (IDF: a word few passages hold
says more about what the conversation is about), times a decay per turn back (the last
question counts most), times a boost for an entity (`pg_dump`, `VACUUM`, `work_mem`: a word
with an underscore, a digit, a dot or in capitals). Assistant turns are read past: an answer's
words are the sources', and carrying them drifts the search towards what was already found.

Invariants: a question with no earlier user turn is returned unchanged; the rewrite only adds
words after the follow-up, never drops or reorders its own; it is pure and takes microseconds
(its cost is measured: docs/conversations.md), so it runs on the event loop.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Literal, Protocol

from budget import Deadline
from budget.stage import StageResult

Role = Literal["user", "assistant"]

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*[A-Za-z0-9_]|[A-Za-z]{2,}")
# Words of a question that say how it is asked, not what it is about (the index's stopwords
# are only the 33 commonest English words).
_QUESTION_TEXT = (
    "a about after again all also am an and any are as at be been before being but by can "
    "could did do does doing done each else few find for from get gets give given go "
    "going got had has have having he her here hers him his how i if in into is it its "
    "itself just know let like make makes many may me might more most much must my need "
    "needs no nor not now of off on once one ones only or other our out over own please "
    "same say see set she should show so some such take takes tell than that the their "
    "them then there these they this those to too try under until up us use used using "
    "very want was way ways we were what when where whether which while who whom why will "
    "with without would you your yours"
)
_QUESTION_WORDS = frozenset(_QUESTION_TEXT.split())


@dataclass(frozen=True, slots=True)
class Turn:
    """One earlier message of a conversation."""

    role: Role
    content: str


@dataclass(frozen=True, slots=True)
class Conversation:
    """The question asked now and the turns before it, oldest first."""

    query: str
    history: tuple[Turn, ...] = ()


@dataclass(frozen=True, slots=True)
class RewriteConfig:
    # The most words carried from earlier turns.
    max_terms: int = 6
    # Each turn further back weighs this much less than the one after it.
    decay: float = 0.5
    # An entity's weight over a plain word's.
    entity_boost: float = 1.5
    # A word whose weight is under this share of the heaviest one's is not carried.
    min_share: float = 0.25
    # A follow-up that points back ("it", "that", "they") also carries the entities of the
    # answer just given: "it" is most often the command that answer named.
    answer_entities: bool = True


class TermWeights(Protocol):
    """How much a word says about a passage: its IDF in the index (`BM25Index.idf`), None for
    a stopword or a word no passage holds."""

    def idf(self, word: str) -> float | None: ...


class UniformWeights:
    """Every word that is not a question word weighs the same: for an index without BM25."""

    def idf(self, word: str) -> float | None:
        return None if word.lower() in _QUESTION_WORDS else 1.0


@dataclass(frozen=True, slots=True)
class Rewrite:
    query: str
    # The words carried from earlier turns, in the order they were appended.
    carried: tuple[str, ...] = ()
    # The question as it is read (its sentences scored, quoted): the follow-up with the carried
    # entities only, the names it points back to ("it": VACUUM FULL); the carried plain words
    # find the page but pull the quote towards the earlier turn's sentences. "" : `query`.
    read: str = ""

    @property
    def read_query(self) -> str:
        return self.read or self.query


def _is_entity(word: str) -> bool:
    return (
        any(c in word for c in "_.")
        or any(c.isdigit() for c in word)
        or (word.isupper() and len(word) > 1)
    )


def _words(text: str) -> list[str]:
    return _WORD.findall(text)


_POINTS_BACK = re.compile(r"\b(it|its|they|them|their|this|that|these|those)\b", re.I)


class FollowUpRewriter:
    def __init__(self, weights: TermWeights, config: RewriteConfig | None = None) -> None:
        self._weights = weights
        self._config = config or RewriteConfig()

    def rewrite(self, conversation: Conversation) -> Rewrite:
        asked = [t.content for t in conversation.history if t.role == "user"]
        if not asked:
            return Rewrite(conversation.query)
        config = self._config
        found = _Carried({w.lower() for w in _words(conversation.query)}, self._weights)
        for back, text in enumerate(reversed(asked)):
            # The order words are appended in: oldest turn first, as they were written.
            found.add(text, config.decay**back, config.entity_boost, turn=-back)
        last = conversation.history[-1]
        if (
            config.answer_entities
            and last.role == "assistant"
            and _POINTS_BACK.search(conversation.query)
        ):
            # Entities only (an answer's plain words are its sources'), after the questions'.
            found.add(last.content, 1.0, config.entity_boost, turn=1, entities_only=True)
        carried = found.best(config.max_terms, config.min_share)
        if not carried:
            return Rewrite(conversation.query)
        kept = conversation.query.rstrip()
        entities = " ".join(w for w in carried if _is_entity(w))
        read = f"{kept} {entities}" if entities else conversation.query
        return Rewrite(f"{kept} {' '.join(carried)}", carried, read)


class _Carried:
    """The words earlier turns could carry, each at its heaviest weight, and where it was first
    seen (turn, position), the order carried words are appended in."""

    def __init__(self, present: set[str], weights: TermWeights) -> None:
        self._present = present
        self._weights = weights
        self._weight: dict[str, float] = {}
        self._first_seen: dict[str, tuple[int, int]] = {}
        self._surface: dict[str, str] = {}

    def add(
        self, text: str, scale: float, boost: float, *, turn: int, entities_only: bool = False
    ) -> None:
        for position, word in enumerate(_words(text)):
            key = word.lower()
            entity = _is_entity(word)
            if key in self._present or key in _QUESTION_WORDS or (entities_only and not entity):
                continue
            idf = self._weights.idf(word)
            if idf is None or idf <= 0.0:
                continue
            score = idf * scale * (boost if entity else 1.0)
            if score > self._weight.get(key, 0.0):
                self._weight[key] = score
                self._surface[key] = word
            self._first_seen.setdefault(key, (turn, position))

    def best(self, most: int, min_share: float) -> tuple[str, ...]:
        """The heaviest `most` words at least `min_share` of the heaviest one's weight."""
        if not self._weight:
            return ()
        weight = self._weight
        floor = max(weight.values()) * min_share
        kept = sorted((k for k in weight if weight[k] >= floor), key=lambda k: -weight[k])[:most]
        return tuple(self._surface[k] for k in sorted(kept, key=self._first_seen.__getitem__))


class RewriteStage:
    """The `rewrite` stage: the query searched and the one read for a conversation's last
    question. Run ahead of the answer cache, so a follow-up's cache key holds both."""

    name = "rewrite"

    def __init__(self, rewriter: FollowUpRewriter) -> None:
        self._rewriter = rewriter

    async def run(self, request: Conversation, deadline: Deadline) -> StageResult[Rewrite]:
        started_s = time.perf_counter()
        rewrite = self._rewriter.rewrite(request)
        return StageResult(
            rewrite,
            (time.perf_counter() - started_s) * 1000.0,
            attributes={
                "answer.rewrite.turns": len(request.history),
                "answer.rewrite.carried_terms": len(rewrite.carried),
            },
        )
