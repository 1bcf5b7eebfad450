"""Answer metrics: SQuAD v1.1's official exact match and F1, answer-string recall, citation
precision and recall against a gold passage, and abstention.

`normalize_answer`, `exact_match` and `f1` follow the official SQuAD v1.1 evaluation script
(lower-case, strip punctuation, drop the articles a/an/the, collapse whitespace; F1 over the
bag of normalised tokens; the maximum over the gold answers).
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Collection, Sequence

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_CITATION = re.compile(r"\[(\d{1,3})\]")

# What an answer that declines to answer says. The service's own refusal (and the model's,
# as the system prompt asks) uses the first; the others are common paraphrases.
_ABSTENTION = re.compile(
    r"\b(?:i\s+(?:do\s+not|don't|cannot|can't)\s+know"
    r"|(?:passages|context|sources)\s+(?:do|does)\s+not\s+(?:contain|say|mention|provide)"
    r"|(?:cannot|can't|unable\s+to)\s+(?:answer|find|determine)"
    r"|no\s+(?:relevant\s+)?information)\b",
    re.IGNORECASE,
)


_LISTED = re.compile(r"\b(closest|retrieved) (sources|passages) are (listed|shown)\b", re.I)


def normalize_answer(text: str) -> str:
    """The official SQuAD v1.1 normalisation."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _f1_one(prediction: str, gold: str) -> float:
    predicted = normalize_answer(prediction).split()
    expected = normalize_answer(gold).split()
    same = sum((Counter(predicted) & Counter(expected)).values())
    if same == 0:
        return 0.0
    precision = same / len(predicted)
    recall = same / len(expected)
    return 2 * precision * recall / (precision + recall)


def exact_match(prediction: str, golds: Sequence[str]) -> float:
    """1.0 when the normalised prediction equals a normalised gold answer."""
    normalised = normalize_answer(prediction)
    return float(any(normalised == normalize_answer(gold) for gold in golds))


def f1(prediction: str, golds: Sequence[str]) -> float:
    """Token F1 against the best-matching gold answer."""
    return max((_f1_one(prediction, gold) for gold in golds), default=0.0)


def answer_recall(prediction: str, golds: Sequence[str]) -> float:
    """1.0 when a gold answer appears in the prediction, as whole normalised tokens."""
    haystack = f" {normalize_answer(prediction)} "
    return float(
        any(f" {needle} " in haystack for gold in golds if (needle := normalize_answer(gold)))
    )


def cited_numbers(answer: str) -> tuple[int, ...]:
    """The `[n]` markers in an answer, in order of first appearance."""
    return tuple(dict.fromkeys(int(n) for n in _CITATION.findall(answer)))


def strip_citations(answer: str) -> str:
    """The answer without its `[n]` markers, which are not part of the answer's words."""
    return _CITATION.sub(" ", answer)


def citation_precision(cited: Collection[str], gold: Collection[str]) -> float | None:
    """Share of cited passages that are gold; None when nothing is cited (undefined)."""
    if not cited:
        return None
    return len(set(cited) & set(gold)) / len(set(cited))


def citation_recall(cited: Collection[str], gold: Collection[str]) -> float | None:
    """Share of gold passages that are cited; None when there is no gold passage."""
    if not gold:
        return None
    return len(set(cited) & set(gold)) / len(set(gold))


def abstains(answer: str) -> bool:
    """Whether the answer declines to answer: it says it does not know and says nothing else
    (the service's "The closest sources are listed." aside). "I do not know" followed by a
    guess is an answer, and a wrong one if the guess is."""
    if not answer.strip():
        return True
    sentences = [s for s in re.split(r"(?<=[.!?])\s+", strip_citations(answer).strip()) if s]
    declines = [bool(_ABSTENTION.search(s)) or bool(_LISTED.search(s)) for s in sentences]
    return bool(_ABSTENTION.search(answer)) and all(declines)
