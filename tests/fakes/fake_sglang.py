"""A fake SGLang server speaking the native API's wire format, with scripted failures.

Same endpoints and stream framing as the real server (`data: {json}` + blank line, cumulative
`text`, `meta_info`, `data: [DONE]`), so the real client and the real service run against it.
It exists for the failures a real server will not produce on demand.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

# stall: the response begins, no token comes; silent: not even the response's headers come.
Mode = Literal[
    "ok",
    "error_chunk",
    "drop",
    "stall",
    "silent",
    "reject",
    "slow",
    "router_lost",
    "router_lost_once",
]
# What sglang-router 0.3.2 answers when the worker it chose is gone (test_sglang_router.py).
ROUTER_LOST_WORKER = {
    "type": "Internal Server Error",
    "code": "call_upstream_request_error",
    "message": "error sending request for url (http://127.0.0.1:30001/generate)",
}


@dataclass
class FakeSGLangState:
    model_path: str
    tokens: tuple[str, ...] = ("The", " answer", " is", " here", ".")
    mode: Mode = "ok"
    token_delay_s: float = 0.01
    prompt_tokens: int = 42
    # What `reject` answers (400) and `error_chunk` sends mid-stream.
    reject_message: str = (
        "The input (9000 tokens) is longer than the model's context length (8192)."
    )
    error_message: str = "scheduler crashed"
    cached_tokens: int = 0
    healthy: bool = True
    aborted: list[str] = field(default_factory=list)
    # Requests (rids) whose client closed the connection while the fake was silent.
    disconnected: list[str] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)

    def last_aborted_within(self, seconds: float) -> bool:
        """Whether the last request's rid is aborted within `seconds` from now."""
        rid = self.requests[-1]["rid"]
        deadline = time.monotonic() + seconds
        while rid not in self.aborted and time.monotonic() < deadline:
            time.sleep(0.01)
        return rid in self.aborted


def _chunk(state: FakeSGLangState, rid: str, text: str, n: int, finish: str | None) -> bytes:
    meta = {
        "id": rid,
        "prompt_tokens": state.prompt_tokens,
        "completion_tokens": n,
        "cached_tokens": state.cached_tokens,
        "finish_reason": None if finish is None else {"type": finish},
    }
    return f"data: {json.dumps({'text': text, 'meta_info': meta})}\n\n".encode()


async def _stream(state: FakeSGLangState, rid: str) -> AsyncIterator[bytes]:
    if state.mode == "stall":
        await asyncio.sleep(3600)
    text = ""
    for n, token in enumerate(state.tokens, start=1):
        await asyncio.sleep(state.token_delay_s)
        if rid in state.aborted:
            yield _chunk(state, rid, text, n - 1, "abort")
            yield b"data: [DONE]\n\n"
            return
        if state.mode == "drop" and n == 3:
            raise RuntimeError("fake server dies mid-stream")
        if state.mode == "error_chunk" and n == 3:
            error = {"message": state.error_message, "type": "InternalError", "code": 500}
            yield f"data: {json.dumps({'error': error})}\n\n".encode()
            return
        if state.mode == "slow" and n >= 2:
            await asyncio.sleep(3600)
        text += token
        yield _chunk(state, rid, text, n, "stop" if n == len(state.tokens) else None)
    yield b"data: [DONE]\n\n"


def create_fake_sglang(state: FakeSGLangState) -> FastAPI:
    app = FastAPI()

    @app.get("/health")
    async def health() -> JSONResponse:
        return JSONResponse({}, status_code=200 if state.healthy else 503)

    @app.get("/get_model_info")
    async def model_info() -> dict[str, Any]:
        return {"model_path": state.model_path, "is_generation": True}

    @app.post("/generate")
    async def generate(request: Request) -> Any:
        body = await request.json()
        state.requests.append(body)
        if state.mode in ("router_lost", "router_lost_once"):
            if state.mode == "router_lost_once":
                state.mode = "ok"
            return JSONResponse({"error": ROUTER_LOST_WORKER}, status_code=500)
        if state.mode == "silent":  # until the client goes away
            while (await request.receive())["type"] != "http.disconnect":
                pass
            state.disconnected.append(body["rid"])
            return JSONResponse({}, status_code=499)
        if state.mode == "reject":
            return JSONResponse({"error": {"message": state.reject_message}}, status_code=400)
        return StreamingResponse(_stream(state, body["rid"]), media_type="text/event-stream")

    @app.post("/abort_request")
    async def abort(request: Request) -> dict[str, Any]:
        state.aborted.append((await request.json())["rid"])
        return {}

    return app
