"""A degenerate loop in a streamed answer, caught as it happens: a small model given a long
context often says one right sentence and then the same sentence again and again until its token
limit. The answer is stopped (and the server's request aborted) at the loop's first sign:

- a sentence of `min_words` or more words right after the same sentence, or for the third time;
- a run of `ngram` words that has already appeared twice.

A phrase used twice on purpose ("the lock is taken ... the lock is released") is neither: a
repeated sentence must repeat whole, and a repeated run must be long and come a third time.
"""

from __future__ import annotations

import re
from collections import Counter

_WORD = re.compile(r"[a-z0-9]+")


def _normalized(text: str) -> tuple[str, ...]:
    return tuple(_WORD.findall(text.lower()))


class RepetitionGuard:
    def __init__(
        self, *, min_words: int = 4, ngram: int = 12, ngram_repeats: int = 3, enabled: bool = True
    ) -> None:
        self.enabled = enabled
        self.min_words = min_words
        self.ngram = ngram
        self.ngram_repeats = ngram_repeats
        self._sentences: Counter[tuple[str, ...]] = Counter()
        self._last: tuple[str, ...] = ()
        self._words: list[str] = []
        self._grams: Counter[tuple[str, ...]] = Counter()
        self._tail = ""

    def sentence(self, text: str) -> bool:
        """A finished sentence; True when it is a loop."""
        if not self.enabled:
            return False
        words = _normalized(text)
        if len(words) < self.min_words:
            return False
        self._sentences[words] += 1
        looping = words == self._last or self._sentences[words] >= 3
        self._last = words
        return looping

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
