"""Cache-aware prompt layout against a real SGLang server: the same passages give the same
bytes, and a prompt that continues a remembered passage sequence is served from the cache as
far as the layout predicted, while the relevance order of the same passages is not."""

from __future__ import annotations

import itertools
import json

import httpx
import pytest

from budget import Deadline
from generation.prefix_order import PrefixTree, PromptLayout
from generation.prompt_layout import ContextPassage, HFChatTemplate, Prompt, build_prompt
from generation.server.launch import SGLangServer
from generation.sglang_client import GenerationResult, SamplingParams, SGLangClient, StreamTimeouts
from tests.support import SQUAD_PASSAGES, open_text

pytestmark = [pytest.mark.integration, pytest.mark.sglang]


@pytest.fixture(scope="module")
def passages() -> dict[str, ContextPassage]:
    with open_text(SQUAD_PASSAGES) as lines:
        records = [json.loads(line) for line in itertools.islice(lines, 100, 110)]
    return {r["_id"]: ContextPassage(0, r["_id"], r["title"], r["text"][:600]) for r in records}


async def _generate(server: SGLangServer, prompt: Prompt) -> GenerationResult:
    async with httpx.AsyncClient(timeout=60) as http:
        stream = await SGLangClient(http, server.url).open_stream(
            prompt.text,
            SamplingParams(max_new_tokens=1),
            StreamTimeouts(first_token=Deadline.after_ms(60_000)),
        )
        async for _ in stream:
            pass
        assert stream.result is not None
        return stream.result


def _prompt(
    template: HFChatTemplate,
    passages: dict[str, ContextPassage],
    ids: list[str],
    question: str,
    layout: PromptLayout,
    tree: PrefixTree,
) -> Prompt:
    return build_prompt(
        question,
        [passages[i] for i in ids],
        template,
        max_prompt_tokens=8000,
        layout=layout,
        tree=tree,
    )


async def test_continued_prefix_is_served_from_the_cache(
    tiny_sglang: SGLangServer, passages: dict[str, ContextPassage]
) -> None:
    async with httpx.AsyncClient(timeout=10) as http:
        assert (await http.post(f"{tiny_sglang.url}/flush_cache")).status_code == 200
    template = HFChatTemplate(str(tiny_sglang.config.model_dir))
    a, b, c, d, e = list(passages)[:5]
    tree = PrefixTree()

    first = _prompt(template, passages, [c, a, b], "Who?", "cache_aware", tree)
    assert (await _generate(tiny_sglang, first)).cached_tokens == 0

    # The same passages ranked otherwise, another question: the same bytes up to the question.
    again = _prompt(template, passages, [b, c, a], "When?", "cache_aware", tree)
    assert again.text.split("Question:")[0] == first.text.split("Question:")[0]
    served = await _generate(tiny_sglang, again)
    assert served.cached_tokens >= again.expected_cached_tokens - 2
    assert again.expected_cached_tokens > 0.8 * again.prompt_tokens

    # Two of three passages continue the remembered sequence: they go first, and are cached.
    cont = _prompt(template, passages, [d, b, a], "Where?", "cache_aware", tree)
    assert [p.source_id for p in cont.passages[:2]] == sorted([a, b])
    served = await _generate(tiny_sglang, cont)
    assert served.cached_tokens >= cont.expected_cached_tokens - 2
    system_only = _prompt(template, passages, [e], "?", "relevance", PrefixTree())
    assert cont.expected_cached_tokens > system_only.prompt_tokens

    # The relevance order of another such set starts with a passage never sent first:
    # only the system prompt is reused.
    relevance = _prompt(template, passages, [d, a, b], "Why?", "relevance", PrefixTree())
    served = await _generate(tiny_sglang, relevance)
    assert served.cached_tokens < cont.expected_cached_tokens / 2


async def test_an_adopted_passage_lets_a_set_reuse_a_prefix_it_does_not_start(
    tiny_sglang: SGLangServer, passages: dict[str, ContextPassage]
) -> None:
    async with httpx.AsyncClient(timeout=10) as http:
        assert (await http.post(f"{tiny_sglang.url}/flush_cache")).status_code == 200
    template = HFChatTemplate(str(tiny_sglang.config.model_dir))
    a, b, c, d = sorted(passages)[:4]
    tree = PrefixTree()
    first = _prompt(template, passages, [b, c, a], "Who?", "cache_aware", tree)
    assert [p.source_id for p in first.passages] == [a, b, c]
    await _generate(tiny_sglang, first)

    def laid_out(adopt: int) -> Prompt:
        return build_prompt(
            "When?", [passages[i] for i in (c, b, d)], template, max_prompt_tokens=8000,
            layout="cache_aware", tree=tree, adopt=adopt, lookup=passages.get, remember=False,
        )  # fmt: skip

    # b, c, d share two passages with the first prompt, but it started with a: without
    # adoption only the system prompt is reusable. With one adopted place, a comes along
    # (d, ranked last, gives way) and every passage is read from the cache.
    plain, adopted = laid_out(0), laid_out(1)
    assert [p.source_id for p in adopted.passages] == [a, b, c]
    assert adopted.adopted == (a,)
    assert adopted.expected_cached_tokens > 0.8 * adopted.prompt_tokens
    assert plain.expected_cached_tokens < adopted.expected_cached_tokens / 2
    served = await _generate(tiny_sglang, adopted)
    assert served.cached_tokens >= adopted.expected_cached_tokens - 2
