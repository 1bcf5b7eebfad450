"""What the pipeline needs of a generation server, as protocols and plain values: open a stream
of token deltas for a prompt (bounded by the request's deadline), abort it by closing it, ask
whether the server is healthy and which model it serves. `SGLangClient` (sglang_client.py) is
the implementation; tests/fakes has one that honours the same protocol."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from budget import Deadline


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    # Decode all `max_new_tokens` whatever the model says (load and abort tests).
    ignore_eos: bool = False
    # SGLang's sampling penalties on tokens already generated (0 and 1: none).
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    # Added to these tokens' logits at every step (token id, bias): the copy bias.
    logit_bias: tuple[tuple[int, float], ...] = ()

    def to_json(self) -> dict[str, Any]:
        params: dict[str, Any] = {
            "max_new_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
        }
        if self.stop:
            params["stop"] = list(self.stop)
        if self.ignore_eos:
            params["ignore_eos"] = True
        if self.frequency_penalty:
            params["frequency_penalty"] = self.frequency_penalty
        if self.repetition_penalty != 1.0:
            params["repetition_penalty"] = self.repetition_penalty
        if self.logit_bias:
            params["logit_bias"] = {str(token): bias for token, bias in self.logit_bias}
        return params


@dataclass(frozen=True, slots=True)
class TokenDelta:
    text: str
    completion_tokens: int


@dataclass(frozen=True, slots=True)
class GenerationResult:
    rid: str
    text: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    finish_reason: str
    ttft_ms: float | None
    elapsed_ms: float


@dataclass(frozen=True, slots=True)
class StreamTimeouts:
    """`first_token` comes from the request's deadline; `next_token` bounds each later gap."""

    first_token: Deadline
    connect_s: float = 2.0
    next_token_s: float = 30.0


class TokenStream(Protocol):
    """Token deltas of one request; `result` is set once the server has finished it, or once
    it was closed before (`finish_reason` "abort", with what was done by then).
    `close_nowait()` releases it from any `finally` and aborts the request server-side if it
    has not finished."""

    @property
    def rid(self) -> str: ...

    @property
    def result(self) -> GenerationResult | None: ...

    def __aiter__(self) -> AsyncIterator[TokenDelta]: ...

    def close_nowait(self) -> None: ...


class GenerationClient(Protocol):
    @property
    def base_url(self) -> str: ...

    async def open_stream(
        self,
        prompt: str,
        params: SamplingParams,
        timeouts: StreamTimeouts,
        *,
        rid: str | None = None,
    ) -> TokenStream: ...

    async def health(self, timeout_s: float = 2.0) -> bool: ...

    async def model_path(self, timeout_s: float = 2.0) -> str: ...

    async def drain(self) -> None: ...
