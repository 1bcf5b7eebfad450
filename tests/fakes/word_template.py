"""A chat template for unit tests: `role: content` lines, whitespace words as tokens."""

from __future__ import annotations

from collections.abc import Sequence

from generation.prompt_layout import ChatMessage


class WordTemplate:
    def __init__(self) -> None:
        # A word's token id, as a tokenizer's vocabulary fixes it: the order it was first seen.
        self._ids: dict[str, int] = {}

    def warm_up(self) -> None:
        pass

    def escape(self, text: str) -> str:
        return text

    def render(self, messages: Sequence[ChatMessage]) -> str:
        return "\n".join(f"{m.role}: {m.content}" for m in messages)

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def count_tokens_each(self, texts: Sequence[str]) -> list[int]:
        return [self.count_tokens(text) for text in texts]

    def vocabularies(self, texts: Sequence[str]) -> list[frozenset[int]]:
        return [self.vocabulary([text]) for text in texts]

    def vocabulary(self, texts: Sequence[str]) -> frozenset[int]:
        words = [word for text in texts for word in text.split()]
        return frozenset(self._ids.setdefault(word, len(self._ids)) for word in words)
