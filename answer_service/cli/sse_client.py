"""Reading the service's Server-Sent Events stream as a client (the CLI's `ask`, tests, eval)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx


@dataclass(frozen=True, slots=True)
class ServerEvent:
    event: str
    data: dict[str, Any]


async def iter_events(response: httpx.Response) -> AsyncIterator[ServerEvent]:
    """Parse `event:`/`data:` blocks per the SSE spec (comments and unknown fields ignored)."""
    event = "message"
    data: list[str] = []
    async for line in response.aiter_lines():
        if not line:
            if data:
                yield ServerEvent(event, json.loads("\n".join(data)))
            event, data = "message", []
        elif line.startswith(":"):
            continue
        else:
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "event":
                event = value
            elif name == "data":
                data.append(value)
    if data:
        yield ServerEvent(event, json.loads("\n".join(data)))
