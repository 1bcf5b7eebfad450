"""SGLang on the CPU with the prefix-attention patch (sglang_compat/cpu_prefix_attention): a
RadixAttention hit must not change the greedy answer.

A cold request (no cached prefix) runs plain causal attention, the same call as stock SGLang
makes, so its text is stock SGLang's. The repeat and the same-prefix
new question run the patched path, which attends only the new query rows to the cached keys;
if its mask or its key layout were wrong, their text would differ from the cold text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from generation.prompt_layout import (
    SYSTEM_PROMPT,
    ChatMessage,
    ContextPassage,
    HFChatTemplate,
    render_passage,
)
from generation.server.launch import SGLangServer
from tests.support import SQUAD_PASSAGES, open_text

pytestmark = [pytest.mark.integration, pytest.mark.sglang, pytest.mark.smollm2]

PASSAGE_IDS = ("Warsaw-1", "Warsaw-2", "Warsaw-3", "Warsaw-4", "Warsaw-5")
QUESTION = "What is the population of Warsaw?"
NEW_QUESTION = "Which river flows through Warsaw?"
MAX_NEW_TOKENS = 32


@dataclass(frozen=True, slots=True)
class Completion:
    text: str
    prompt_tokens: int
    cached_tokens: int


def _passages() -> list[ContextPassage]:
    wanted = {pid: n for n, pid in enumerate(PASSAGE_IDS, start=1)}
    found: dict[str, ContextPassage] = {}
    with open_text(SQUAD_PASSAGES) as lines:
        for line in lines:
            row = json.loads(line)
            if row["_id"] in wanted:
                found[row["_id"]] = ContextPassage(
                    wanted[row["_id"]], row["_id"], row["title"], row["text"]
                )
    return [found[pid] for pid in PASSAGE_IDS]


def _prompt(template: HFChatTemplate, question: str) -> str:
    blocks = "\n\n".join(render_passage(p) for p in _passages())
    user = f"Passages:\n\n{blocks}\n\nQuestion: {question}"
    return template.render([ChatMessage("system", SYSTEM_PROMPT), ChatMessage("user", user)])


def _generate(client: httpx.Client, text: str) -> Completion:
    body: dict[str, Any] = {
        "text": text,
        "sampling_params": {"max_new_tokens": MAX_NEW_TOKENS, "temperature": 0.0},
    }
    response = client.post("/generate", json=body)
    response.raise_for_status()
    payload = response.json()
    meta = payload["meta_info"]
    return Completion(payload["text"], meta["prompt_tokens"], meta["cached_tokens"])


def _flush(client: httpx.Client) -> None:
    # SGLang refuses to flush while a request is still being retired; let it wait for idle.
    client.post("/flush_cache", params={"timeout": 30}).raise_for_status()


def test_cache_hits_give_the_cold_answer(smollm2_sglang: SGLangServer, smollm2_dir: Path) -> None:
    template = HFChatTemplate(str(smollm2_dir))
    first, second = _prompt(template, QUESTION), _prompt(template, NEW_QUESTION)
    with httpx.Client(base_url=smollm2_sglang.url, timeout=120.0) as client:
        _flush(client)
        cold = _generate(client, first)
        repeat = _generate(client, first)
        new_question = _generate(client, second)
        _flush(client)
        new_question_cold = _generate(client, second)

    log = smollm2_sglang.log_path.read_text(errors="replace")
    assert "cpu prefix attention installed" in log, "the patch was not active in the server"
    assert cold.prompt_tokens > 1000
    assert cold.cached_tokens == 0
    assert new_question_cold.cached_tokens == 0
    assert repeat.cached_tokens >= cold.prompt_tokens - 2
    assert new_question.cached_tokens > 1000
    assert cold.text.strip(), "the model said nothing"
    assert repeat.text == cold.text
    assert new_question.text == new_question_cold.text
