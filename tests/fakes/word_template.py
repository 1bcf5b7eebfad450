"""A chat template for unit tests: `role: content` lines, whitespace words as tokens."""

from __future__ import annotations

from collections.abc import Sequence

from generation.prompt_layout import ChatMessage


class WordTemplate:
    def warm_up(self) -> None:
        pass

    def escape(self, text: str) -> str:
        return text

    def render(self, messages: Sequence[ChatMessage]) -> str:
        return "\n".join(f"{m.role}: {m.content}" for m in messages)

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def vocabulary(self, texts: Sequence[str]) -> frozenset[int]:
        # A word's token id: its place among the distinct words of the texts.
        return frozenset(range(len({word for text in texts for word in text.split()})))
