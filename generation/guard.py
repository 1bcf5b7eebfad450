"""A degenerate loop in a streamed answer, caught as it happens: a small model given a long
context often says one right sentence and then the same sentence again and again until its token
limit. The answer is stopped (and the server's request aborted) at the loop's first sign:

- a sentence of `min_words` or more words right after the same sentence, or for the third time;
- a run of `ngram` words that has already appeared twice.

A phrase used twice on purpose ("the lock is taken ... the lock is released") is neither: a
repeated sentence must repeat whole, and a repeated run must be long and come a third time.
A whole sentence said a second time, not right after itself, is a `repeat`: not a loop, but
nothing the reader needs twice, so the caller leaves it out. `may_repeat` tells whether the
sentence still being written could turn out to be one, so that the caller holds it back until
it is decided and a repeated sentence is never shown, not even in part.

Sentences compare by their words (lower case, without articles or punctuation), as answer
metrics compare answers.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Literal

Verdict = Literal["new", "repeat", "loop"]

_WORD = re.compile(r"[a-z0-9]+")
_ARTICLES = frozenset({"a", "an", "the"})


def _normalized(text: str) -> tuple[str, ...]:
    return tuple(w for w in _WORD.findall(text.lower()) if w not in _ARTICLES)


class RepetitionGuard:
    def __init__(
        self, *, min_words: int = 4, ngram: int = 12, ngram_repeats: int = 3, enabled: bool = True
    ) -> None:
        self.enabled = enabled
        self.min_words = min_words
        self.ngram = ngram
        self.ngram_repeats = ngram_repeats
        self._sentences: Counter[tuple[str, ...]] = Counter()
        # The sentences said so far, as normalised text (for `may_repeat`'s prefix test).
        self._said: set[str] = set()
        self._last: tuple[str, ...] = ()
        self._words: list[str] = []
        self._grams: Counter[tuple[str, ...]] = Counter()
        self._tail = ""

    def sentence(self, text: str) -> Verdict:
        """A finished sentence: `loop` when it repeats the one before or comes a third time,
        `repeat` when it was said before, else `new`."""
        if not self.enabled:
            return "new"
        words = _normalized(text)
        if len(words) < self.min_words:
            return "new"
        self._sentences[words] += 1
        count = self._sentences[words]
        looping = words == self._last or count >= 3
        self._last = words
        self._said.add(" ".join(words))
        if looping:
            return "loop"
        return "repeat" if count > 1 else "new"

    def may_repeat(self, partial: str) -> bool:
        """Whether a sentence that begins with `partial` (its last word perhaps cut short)
        could still end as one already said."""
        if not self.enabled or not self._said or not partial.strip():
            return False
        start = " ".join(_normalized(partial))
        if not start:
            # No word yet (an article, a code fence, a list's bullet): any sentence may follow.
            return True
        if partial[-1].isalnum():  # its last word may go on ("lock" -> "locking")
            return any(said.startswith(start) for said in self._said)
        return any(said == start or said.startswith(f"{start} ") for said in self._said)

    def feed(self, delta: str) -> bool:
        """A piece of the answer; True when its words now run in a loop."""
        if not self.enabled:
            return False
        text = self._tail + delta
        # The last word may be cut by the delta's end: keep it for the next piece.
        cut = len(text) if not text or not text[-1].isalnum() else text.rfind(" ") + 1
        self._tail = text[cut:]
        for word in _normalized(text[:cut]):
            self._words.append(word)
            if len(self._words) >= self.ngram:
                gram = tuple(self._words[-self.ngram :])
                self._grams[gram] += 1
                if self._grams[gram] >= self.ngram_repeats:
                    return True
        return False
