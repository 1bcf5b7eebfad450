"""`answer-service ask --interactive`: each question is sent with the conversation before it,
`/new` starts over, and an empty line ends it (the HTTP call itself replaced by a recorder)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from answer_service.cli import ask


async def test_each_question_is_sent_with_the_turns_before_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lines = iter(["What is VACUUM?", "What lock does it take?", "/new", "What is work_mem?", ""])
    sent: list[tuple[str, list[dict[str, str]]]] = []

    async def answer(
        url: str,
        question: str,
        budget_ms: int | None,
        top_k: int | None,
        api_key: str | None = None,
        answer_mode: str | None = None,
        history: Sequence[dict[str, str]] = (),
    ) -> tuple[int, str]:
        sent.append((question, list(history)))
        return 0, f"answer to {question}"

    monkeypatch.setattr("builtins.input", lambda _prompt="": next(lines))
    monkeypatch.setattr(ask, "_answer", answer)
    assert await ask.converse("http://service", None, None) == 0
    assert [q for q, _ in sent] == [
        "What is VACUUM?",
        "What lock does it take?",
        "What is work_mem?",
    ]
    assert sent[0][1] == []
    assert sent[1][1] == [
        {"role": "user", "content": "What is VACUUM?"},
        {"role": "assistant", "content": "answer to What is VACUUM?"},
    ]
    assert sent[2][1] == []  # after /new
