"""An in-process generation client honouring `GenerationClient` (generation/client.py): each
prompt gets the scripted answer, one delta per piece, with usage as SGLang reports it, after a
prefill that a batching backend runs for all prompts at once and another one at a time. For the
pipeline's unit tests; the contract suite runs it beside the real `SGLangClient`."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

from generation.client import (
    GenerationResult,
    SamplingParams,
    StreamTimeouts,
    TokenDelta,
)
from generation.errors import GenerationTimeoutError

Script = Callable[[str], Sequence[str]]
"""The answer's pieces for a prompt."""


@dataclass
class ScriptedStream:
    rid: str
    pieces: Sequence[str]
    prompt_tokens: int
    max_new_tokens: int
    timeouts: StreamTimeouts
    delay_s: float
    client: ScriptedGeneration
    result: GenerationResult | None = None
    _closed: bool = False
    _partial: tuple[str, int] = ("", 0)

    async def __aiter__(self) -> AsyncIterator[TokenDelta]:
        started_s = time.perf_counter()
        text, n, ttft_ms = "", 0, None
        try:
            await self.client.prefill()
            for piece in self.pieces[: self.max_new_tokens]:
                if self._closed:
                    return
                self._partial = (text, n)
                if self.delay_s:
                    if n == 0 and self.timeouts.first_token.remaining_s() < self.delay_s:
                        raise GenerationTimeoutError("no first token from the fake in time")
                    await asyncio.sleep(self.delay_s)
                text, n = text + piece, n + 1
                if ttft_ms is None:
                    ttft_ms = (time.perf_counter() - started_s) * 1000.0
                yield TokenDelta(piece, n)
            finish = "length" if len(self.pieces) > self.max_new_tokens else "stop"
            self.result = GenerationResult(
                self.rid,
                text,
                self.prompt_tokens,
                0,
                n,
                finish,
                ttft_ms,
                (time.perf_counter() - started_s) * 1000.0,
            )
        finally:
            self.close_nowait()

    def close_nowait(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.result is None:
            self.client.aborted.append(self.rid)
            text, n = self._partial
            self.result = GenerationResult(
                self.rid, text, self.prompt_tokens, 0, n, "abort", None, 0.0
            )


@dataclass
class ScriptedGeneration:
    script: Script
    base_url: str = "http://scripted"
    model: str = "test/scripted"
    delay_s: float = 0.0
    prompts: list[str] = field(default_factory=list)
    params: list[SamplingParams] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    # Each prompt's prefill before its first piece: `prefill_s` seconds, all at once where the
    # backend `batches` (a GPU), one after another where it does not (a CPU).
    prefill_s: float = 0.0
    batches: bool = True
    _prefilling: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def prefill(self) -> None:
        if not self.prefill_s:
            return
        if self.batches:
            await asyncio.sleep(self.prefill_s)
            return
        async with self._prefilling:
            await asyncio.sleep(self.prefill_s)

    async def open_stream(
        self,
        prompt: str,
        params: SamplingParams,
        timeouts: StreamTimeouts,
        *,
        rid: str | None = None,
    ) -> ScriptedStream:
        self.prompts.append(prompt)
        self.params.append(params)
        return ScriptedStream(
            rid or uuid.uuid4().hex,
            list(self.script(prompt)),
            len(prompt.split()),
            params.max_new_tokens,
            timeouts,
            self.delay_s,
            self,
        )

    async def health(self, timeout_s: float = 2.0) -> bool:
        return True

    async def model_path(self, timeout_s: float = 2.0) -> str:
        return self.model

    async def drain(self) -> None:
        return None


def words(text: str) -> Script:
    """A script that answers every prompt with `text`, a word (and its space) per delta."""
    pieces = [word + " " for word in text.split(" ")]
    pieces[-1] = pieces[-1].rstrip()
    return lambda _prompt: pieces
