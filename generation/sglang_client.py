"""An async client for SGLang's native `/generate` API, streamed.

One shared `httpx.AsyncClient` (owned by the caller) carries every request. Each request has
its own `rid`; a request given up before the server finished it (the caller went away, a
timeout, an error; while streaming or still waiting for the response's headers) is aborted:
`/abort_request` for that rid, and its connection closed, so no work is left running. Behind
sglang-router, which has no `/abort_request` of its own (404), the abort goes to each of the
router's workers (generation/server/router.py).

Error messages name no address: neither this server's URL nor any URL in what the server
said (they reach clients through the service); the log has both.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, field
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, ValidationError

from generation.client import (
    GenerationResult,
    SamplingParams,
    StreamTimeouts,
    TokenDelta,
)
from generation.errors import (
    GenerationError,
    GenerationTimeoutError,
    PromptTooLongError,
    SGLangRequestError,
    SGLangUnavailableError,
    WorkerLostError,
)

logger = logging.getLogger(__name__)

_ABORT_TIMEOUT_S = 1.0


class _MetaInfo(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    finish_reason: dict[str, Any] | None = None


class _Chunk(BaseModel):
    """One `data:` line of the stream (SGLang's JSON, validated at the edge)."""

    model_config = ConfigDict(extra="ignore")

    text: str = ""
    meta_info: _MetaInfo = _MetaInfo()
    error: dict[str, Any] | None = None


# What sglang-router (0.3.2) answers when the worker it chose refuses the connection or drops
# it before answering (tests/integration/test_sglang_router.py kills a worker to see it).
_ROUTER_UPSTREAM_ERROR = "call_upstream_request_error"


def _router_lost_its_worker(status_code: int, body: bytes) -> bool:
    try:
        code = json.loads(body)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return False
    return status_code >= 500 and code == _ROUTER_UPSTREAM_ERROR


_URL = re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s'\"()<>]+", re.IGNORECASE)


def _without_urls(text: str) -> str:
    return _URL.sub("<url>", text)


def _error_from_body(status_code: int, body: bytes, url: str) -> SGLangRequestError:
    logger.warning("sglang refused url=%s status=%d body=%r", url, status_code, body[:1000])
    try:
        message = str(json.loads(body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        message = body.decode("utf-8", "replace")[:500]
    message = _without_urls(message)
    if "context length" in message or "too long" in message:
        return PromptTooLongError(message, status_code)
    return SGLangRequestError(f"SGLang answered {status_code}: {message}", status_code)


@dataclass(slots=True)
class GenerationStream:
    """Token deltas of one request; `result` is set once the server has finished it."""

    rid: str
    _client: SGLangClient
    _response: httpx.Response
    _timeouts: StreamTimeouts
    _sent_at_s: float
    result: GenerationResult | None = None
    _text: str = ""
    _meta: _MetaInfo = field(default_factory=_MetaInfo)
    _ttft_ms: float | None = None
    _closed: bool = False

    async def __aiter__(self) -> AsyncIterator[TokenDelta]:
        lines = self._response.aiter_lines()
        try:
            while True:
                timeout_s = (
                    self._timeouts.first_token.remaining_s()
                    if self._ttft_ms is None
                    else self._timeouts.next_token_s
                )
                try:
                    async with asyncio.timeout(timeout_s):
                        line = await anext(lines)
                except StopAsyncIteration:
                    break
                except TimeoutError as exc:
                    which = "first" if self._ttft_ms is None else "next"
                    raise GenerationTimeoutError(
                        f"no {which} token from SGLang within {timeout_s * 1000:.0f} ms"
                    ) from exc
                except httpx.HTTPError as exc:
                    logger.warning(
                        "sglang stream broke rid=%s url=%s error=%r",
                        self.rid,
                        self._client.base_url,
                        exc,
                    )
                    raise SGLangUnavailableError(
                        f"SGLang stream broke: {_without_urls(str(exc))}"
                    ) from exc
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    break
                delta = self._consume(payload)
                if delta is not None:
                    yield delta
            self._finish()
        finally:
            self.close_nowait()

    def _consume(self, payload: str) -> TokenDelta | None:
        try:
            chunk = _Chunk.model_validate_json(payload)
        except ValidationError as exc:
            raise SGLangRequestError(f"unreadable chunk from SGLang: {exc}") from exc
        if chunk.error is not None:
            body = json.dumps({"error": chunk.error}).encode()
            raise _error_from_body(500, body, self._client.base_url)
        self._meta = chunk.meta_info
        # SGLang streams the cumulative text; the delta is what extends the previous one.
        if not chunk.text.startswith(self._text):
            logger.warning("sglang text rewound rid=%s", self.rid)
            return None
        new_text = chunk.text[len(self._text) :]
        self._text = chunk.text
        if not new_text:
            return None
        if self._ttft_ms is None:
            self._ttft_ms = (time.perf_counter() - self._sent_at_s) * 1000.0
        return TokenDelta(text=new_text, completion_tokens=chunk.meta_info.completion_tokens)

    def _finish(self, aborted: bool = False) -> None:
        reason = {"type": "abort"} if aborted else (self._meta.finish_reason or {})
        self.result = GenerationResult(
            rid=self.rid,
            text=self._text,
            prompt_tokens=self._meta.prompt_tokens,
            cached_tokens=self._meta.cached_tokens,
            completion_tokens=self._meta.completion_tokens,
            finish_reason=str(reason.get("type", "unknown")),
            ttft_ms=self._ttft_ms,
            elapsed_ms=(time.perf_counter() - self._sent_at_s) * 1000.0,
        )

    def close_nowait(self) -> None:
        """Release the stream without awaiting (safe in any `finally`, even when cancelled).

        If the server has not finished the request, it is told to abort it, and `result` says
        what it had done by then (`finish_reason` "abort").
        """
        if self._closed:
            return
        self._closed = True
        if self.result is None:
            self._client.abort_in_background(self.rid)
            self._finish(aborted=True)
        self._client.spawn(self._response.aclose())

    async def aclose(self) -> None:
        self.close_nowait()
        await self._response.aclose()


class SGLangClient:
    def __init__(self, http: httpx.AsyncClient, base_url: str) -> None:
        self._http = http
        self.base_url = base_url.rstrip("/")
        self._background: set[asyncio.Task[None]] = set()
        # Learnt from the first abort: the URL is sglang-router's (no /abort_request there).
        self._routed = False

    async def open_stream(
        self,
        prompt: str,
        params: SamplingParams,
        timeouts: StreamTimeouts,
        *,
        rid: str | None = None,
    ) -> GenerationStream:
        """Send the request and wait for the response headers; tokens come from the stream.

        The headers are waited for until `timeouts.first_token` at most (the request's hard
        deadline): then the server is told to abort the request and `GenerationTimeoutError`
        is raised. Raises `SGLangUnavailableError` when the server cannot be reached, and
        `SGLangRequestError` (or `PromptTooLongError`) when it refuses the request.
        """
        rid = rid or uuid.uuid4().hex
        body = {"text": prompt, "sampling_params": params.to_json(), "stream": True, "rid": rid}
        wait_s = max(timeouts.first_token.remaining_s(), 0.05)
        connect_s = min(timeouts.connect_s, wait_s)
        # No read timeout: the first token's wait is bounded below, and each later gap by
        # the stream itself (`next_token_s`).
        timeout = httpx.Timeout(connect=connect_s, read=None, write=connect_s, pool=connect_s)
        request = self._http.build_request(
            "POST", f"{self.base_url}/generate", json=body, timeout=timeout
        )
        sent_at_s = time.perf_counter()
        try:
            async with asyncio.timeout(wait_s):
                response = await self._http.send(request, stream=True)
        except TimeoutError as exc:
            self.abort_in_background(rid)
            raise GenerationTimeoutError(
                f"no response from SGLang within {wait_s * 1000:.0f} ms"
            ) from exc
        except httpx.TransportError as exc:
            logger.warning("sglang unreachable url=%s error=%r", self.base_url, exc)
            raise SGLangUnavailableError(
                f"cannot reach SGLang: {type(exc).__name__}: {_without_urls(str(exc))}"
            ) from exc
        except BaseException:  # cancelled (the caller went away) with the request sent
            self.abort_in_background(rid)
            raise
        if response.status_code != 200:
            content = await response.aread()
            await response.aclose()
            if _router_lost_its_worker(response.status_code, content):
                logger.warning("sglang router lost a worker url=%s body=%r", self.base_url, content)
                raise WorkerLostError("the router lost the worker it chose")
            raise _error_from_body(response.status_code, content, self.base_url)
        return GenerationStream(rid, self, response, timeouts, sent_at_s)

    async def abort(self, rid: str) -> None:
        """Ask the server to stop `rid`; behind sglang-router, every worker of the router
        (one without the rid answers 200 and ignores it). Failures are logged, not raised."""
        try:
            if not self._routed:
                if await self._abort_at(self.base_url, rid) != 404:
                    return
                self._routed = True
                logger.info("no /abort_request at url=%s: aborting on its workers", self.base_url)
            workers = await self._router_workers()
            await asyncio.gather(*(self._abort_at(url, rid) for url in workers))
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            logger.warning("sglang abort failed rid=%s url=%s error=%r", rid, self.base_url, exc)

    async def _abort_at(self, url: str, rid: str) -> int:
        response = await self._http.post(
            f"{url}/abort_request", json={"rid": rid}, timeout=_ABORT_TIMEOUT_S
        )
        logger.info("sglang abort rid=%s url=%s status=%d", rid, url, response.status_code)
        return response.status_code

    async def _router_workers(self) -> list[str]:
        """The workers sglang-router routes to (`GET /workers`), asked at each abort: the
        router adds and drops workers as they come and go."""
        response = await self._http.get(f"{self.base_url}/workers", timeout=_ABORT_TIMEOUT_S)
        response.raise_for_status()
        return [str(worker["url"]).rstrip("/") for worker in response.json()["workers"]]

    def abort_in_background(self, rid: str) -> None:
        """Abort from a task of its own, so it runs even while the caller is being cancelled."""
        self.spawn(self.abort(rid))

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def health(self, timeout_s: float = 2.0) -> bool:
        """Whether the server takes requests. An SGLang server answers `/ready` at once;
        sglang-router has no `/ready` and answers `/readiness` (503 until a worker is healthy;
        its `/health` is always 200); `/health` (servers with neither) generates one token and
        takes at least a second in SGLang 0.5."""
        try:
            for path in ("/ready", "/readiness"):
                response = await self._http.get(f"{self.base_url}{path}", timeout=timeout_s)
                if response.status_code != 404:
                    return response.status_code == 200
            response = await self._http.get(f"{self.base_url}/health", timeout=max(timeout_s, 5.0))
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    async def model_path(self, timeout_s: float = 2.0) -> str:
        try:
            response = await self._http.get(f"{self.base_url}/get_model_info", timeout=timeout_s)
            response.raise_for_status()
            return str(response.json()["model_path"])
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            raise GenerationError(f"cannot read the model from {self.base_url}: {exc}") from exc

    async def drain(self) -> None:
        """Wait for pending aborts (at shutdown)."""
        if self._background:
            await asyncio.wait(self._background, timeout=_ABORT_TIMEOUT_S * 2)
