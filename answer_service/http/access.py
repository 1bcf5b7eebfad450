"""Who may call the API and how much: an ASGI middleware in front of every route.

- Request bodies over `max_body_bytes` get 413, whether announced (Content-Length) or streamed.
- With API keys configured (`ANSWER_API_KEYS_FILE`), every `/v1/` route needs one, as
  `Authorization: Bearer <key>` (what the `openai` client sends) or `X-API-Key`: none or an
  unknown one gets 401; over the key's rate, or with `max_streams` answers already open on
  this replica, 429 with `Retry-After`. The key's tenant tier is the request's tier
  (`answering.answer_request` refuses another one asked for in X-Tenant-Tier with 403).
  `/mcp` needs a valid key too (401), but its rate and open answers are counted on the `/v1/`
  routes its tools call, once. Health, readiness, metrics, the dashboard and the search page
  stay open: put them behind the network's own controls.

It wraps the whole response, streams included, so an open answer counts until its last byte.
It also times every refusal with Retry-After (429, 503; its own and the routes') from the
moment the request reaches it to the response's start (`answer_refusal_seconds`).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from answer_service.errors import (
    PayloadTooLargeError,
    RateLimitedError,
    ServiceError,
    UnauthorizedError,
)
from answer_service.runtime.document_writer import DOCUMENT_MAX_BYTES
from answer_service.runtime.keys.auth import ApiKey

logger = logging.getLogger(__name__)

PROTECTED_PREFIX = "/v1/"
COLLECTIONS_PREFIX = "/v1/collections/"
# The MCP endpoint (answer_service/mcp/http_mount.py): its tools call /v1/ routes with the key.
MCP_PATH = "/mcp"


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value).decode("latin-1")
    return None


def _presented_key(scope: Scope) -> str | None:
    authorization = _header(scope, b"authorization")
    if authorization is not None:
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    api_key = _header(scope, b"x-api-key")
    return api_key.strip() if api_key and api_key.strip() else None


async def _refuse(send: Send, error: ServiceError, headers: dict[str, str] | None = None) -> None:
    body = json.dumps({"error": {"code": error.code, "message": error.message}}).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if error.retry_after_s is not None:
        raw.append((b"retry-after", str(error.retry_after_s).encode()))
    raw += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": error.status_code, "headers": raw})
    await send({"type": "http.response.body", "body": body})


async def _refuse_key(send: Send, presented: str | None) -> None:
    message = (
        "an API key is required: send `Authorization: Bearer <key>` or `X-API-Key`"
        if presented is None
        else "the API key is not valid"
    )
    await _refuse(send, UnauthorizedError(message), {"www-authenticate": "Bearer"})


async def _read_at_most(receive: Receive, limit: int) -> bytes | None:
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":  # the client went away
            return b"".join(parts)
        size += len(message.get("body", b""))
        if size > limit:
            return None
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(parts)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # later: disconnects

    return replayed


_SHED_STATUSES = frozenset((429, 503))


def _timing_refusals(send: Send, components: Any) -> Send:
    """`send`, observing the time to a 429 or 503 response since now."""
    started = time.perf_counter()
    histogram = components.metrics.refusal

    async def timed(message: Message) -> None:
        if message["type"] == "http.response.start" and message["status"] in _SHED_STATUSES:
            histogram.labels(str(message["status"])).observe(time.perf_counter() - started)
        await send(message)

    return timed


class AccessMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        components: Any = scope["app"].state.components
        if scope["path"].startswith(PROTECTED_PREFIX):
            send = _timing_refusals(send, components)
        limit = components.settings.max_body_bytes
        if scope["method"] == "PUT" and scope["path"].startswith(COLLECTIONS_PREFIX):
            limit = DOCUMENT_MAX_BYTES  # the body is a document
        length = _header(scope, b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            await _refuse(send, PayloadTooLargeError(f"the body is over {limit} bytes"))
            return
        key: ApiKey | None = None
        if components.keys is not None and scope["path"] == MCP_PATH:
            # Authenticated only: the tools' calls to /v1/ routes are rate limited and counted.
            presented = _presented_key(scope)
            if not presented or components.keys.find(presented) is None:
                await _refuse_key(send, presented)
                return
        if components.keys is not None and scope["path"].startswith(PROTECTED_PREFIX):
            presented = _presented_key(scope)
            key = components.keys.find(presented) if presented else None
            if key is None:
                await _refuse_key(send, presented)
                return
            decision = await components.rate_limiter.check(key)
            if not decision.allowed:
                await _refuse(
                    send,
                    RateLimitedError(
                        f"key {key.key_id!r} is over its rate of {key.rate_per_s:g} requests/s",
                        retry_after_s=decision.retry_after_s,
                    ),
                )
                return
            if not components.streams.try_open(key):
                await _refuse(
                    send,
                    RateLimitedError(
                        f"key {key.key_id!r} already has {key.max_streams} answers open",
                        retry_after_s=1,
                    ),
                )
                return
            scope.setdefault("state", {})["api_key"] = key
        try:
            if length is None and scope["method"] in ("POST", "PUT", "PATCH"):
                # No Content-Length (chunked): read it here, up to the limit, then replay it.
                body = await _read_at_most(receive, limit)
                if body is None:
                    await _refuse(send, PayloadTooLargeError(f"the body is over {limit} bytes"))
                    return
                receive = _replay(body, receive)
            await self.app(scope, receive, send)
        finally:
            if key is not None:
                components.streams.close(key)
