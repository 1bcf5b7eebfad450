"""Generation's stages, each `run(request, deadline) -> StageResult` (budget/stage.py): lay the
prompt out (with the generation re-plan: the most planned passages whose first token still
fits), and send it (SGLang's stream, open up to its response headers)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from budget import Deadline
from budget.stage import StageCut, StageResult
from generation.client import GenerationClient, SamplingParams, StreamTimeouts, TokenStream
from generation.prefix_order import PrefixTree, PromptLayout
from generation.prompt_layout import (
    ChatTemplate,
    ContextPassage,
    PassageLookup,
    Prompt,
    PromptAssembler,
    build_prompt,
)

PromptFit = Callable[[Prompt], tuple[bool, float]]
"""Whether a laid-out prompt's first token still fits the time left, and the prediction."""


@dataclass(frozen=True, slots=True)
class PromptConfig:
    max_prompt_tokens: int = 1800
    layout: PromptLayout = "cache_aware"
    slack: int = 0
    adopt: int = 0
    # A worked exchange before the question (prompt_layout.example_turns).
    example: bool = True
    # Find the tokens the prompt's passages are made of (`Prompt.vocabulary`), for a copy bias.
    vocabulary: bool = False


@dataclass(frozen=True, slots=True)
class PromptRequest:
    question: str
    # Best first; `most` of them (and `slack` more for the layout) may go in.
    passages: Sequence[ContextPassage]
    most: int
    # The prefixes recently sent to the worker that will serve it.
    tree: PrefixTree
    lookup: PassageLookup | None = None
    # The generation re-plan; None: the `most` passages as they are.
    fit: PromptFit | None = None
    # The passages' pieces being made ahead (`PromptStage.prefetch`), awaited before laying
    # the prompt out.
    ready: Awaitable[None] | None = None


class PromptStage:
    """Lays out the prompt with `most` passages, then fewer while the re-plan says the first
    token would come too late (a cut), down to one. The chosen order is remembered in the
    worker's tree. Work: the passages in the prompt."""

    name = "prompt"

    def __init__(self, template: ChatTemplate, config: PromptConfig) -> None:
        # The frame and passage blocks (and each passage's vocabulary, for a copy bias),
        # rendered and tokenized once for every request.
        self._assembler = PromptAssembler(template)
        self._config = config

    def warm_up(self) -> None:
        self._assembler.warm_up()

    def prefetch(self, passages: Sequence[ContextPassage]) -> asyncio.Future[None]:
        """Tokenize what a prompt of `passages` is made of (each block, and its vocabulary for
        a copy bias) in a thread from now, while the request's other stages run; pass the
        future as `PromptRequest.ready`."""
        loop = asyncio.get_running_loop()
        warm = functools.partial(
            self._assembler.warm, tuple(passages), vocabulary=self._config.vocabulary
        )
        future = loop.run_in_executor(None, warm)
        # A prompt that is never made (a quote, an abstention) never awaits it: its failure
        # is taken here, not reported as never retrieved.
        future.add_done_callback(lambda done: done.cancelled() or done.exception())
        return future

    async def run(self, request: PromptRequest, deadline: Deadline) -> StageResult[Prompt]:
        if request.ready is not None:
            # Whatever it did not make (it failed) is made below, and fails there if it must.
            with contextlib.suppress(Exception):
                await request.ready
        # perf_counter, not the loop's clock: uvloop's is read once per loop pass (to the
        # millisecond), so it would count the work that ran before this stage in the same pass.
        started_s = time.perf_counter()
        # One hop to a thread: a passage seen for the first time is tokenized there.
        prompt, predicted_ms = await asyncio.to_thread(self._laid_out, request)
        elapsed_ms = (time.perf_counter() - started_s) * 1000.0
        request.tree.insert([p.source_id for p in prompt.passages])
        n = len(prompt.passages)
        cut = None
        if request.fit is not None and n < request.most:
            cut = StageCut(
                f"{request.most} passages no longer fit the time left; first token predicted "
                f"at {predicted_ms:.0f} ms with {n}",
                n,
            )
        attributes = {
            "answer.prompt.passages": n,
            "answer.prompt.tokens_estimate": prompt.prompt_tokens,
            "answer.prompt.layout": prompt.layout,
            "answer.prompt.expected_cached_tokens": prompt.expected_cached_tokens,
        }
        return StageResult(prompt, elapsed_ms, work=n, cut=cut, attributes=attributes)

    def _laid_out(self, request: PromptRequest) -> tuple[Prompt, float]:
        prompt, predicted_ms = self._fit(request)
        if self._config.vocabulary:
            vocabulary = self._assembler.vocabulary([p.text for p in prompt.passages])
            prompt = dataclasses.replace(prompt, vocabulary=vocabulary)
        return prompt, predicted_ms

    def _fit(self, request: PromptRequest) -> tuple[Prompt, float]:
        config = self._config
        last: tuple[Prompt, float] | None = None
        for n in range(max(request.most, 1), 0, -1):
            prompt = build_prompt(
                request.question,
                request.passages,
                self._assembler,
                max_prompt_tokens=config.max_prompt_tokens,
                layout=config.layout,
                tree=request.tree,
                limit=n,
                slack=config.slack,
                adopt=config.adopt,
                lookup=request.lookup,
                remember=False,
                example=config.example,
            )
            if request.fit is None:
                return prompt, 0.0
            fits, predicted_ms = request.fit(prompt)
            last = (prompt, predicted_ms)
            if fits:
                break
        assert last is not None
        return last


@dataclass(frozen=True, slots=True)
class SendRequest:
    prompt: Prompt
    params: SamplingParams
    timeouts: StreamTimeouts


class SendStage:
    """Sends the prompt and waits for SGLang's response headers (bounded by the request's
    hard deadline); the tokens then come from the returned stream."""

    name = "generate"

    def __init__(self, client: GenerationClient) -> None:
        self.client = client

    async def run(self, request: SendRequest, deadline: Deadline) -> StageResult[TokenStream]:
        started_s = time.perf_counter()
        stream = await self.client.open_stream(
            request.prompt.text, request.params, request.timeouts
        )
        return StageResult(
            stream,
            (time.perf_counter() - started_s) * 1000.0,
            attributes={"gen_ai.response.id": stream.rid, "sglang.worker": self.client.base_url},
        )
