"""Helpers shared by the tests: the data fixtures, free ports, a real uvicorn server in a
thread, SSE collection."""

from __future__ import annotations

import gzip
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

import httpx
import uvicorn
from fastapi import FastAPI

REPO_ROOT = Path(__file__).resolve().parent.parent
# Small subsets of the shared data sets, kept in the repository with their licenses
# (tests/fixtures/*/PROVENANCE.txt); only tests/fixtures/derive.py reads the shared data.
FIXTURES = REPO_ROOT / "tests" / "fixtures"
SQUAD_PASSAGES = FIXTURES / "squad" / "passages.jsonl.gz"  # the first 150 passages
SQUAD_QUESTIONS = FIXTURES / "squad" / "questions.jsonl.gz"  # the 827 questions on them


def open_text(path: Path) -> IO[str]:
    """A fixture's lines, gzip or plain; the service's readers take either."""
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return path.open(encoding="utf-8")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def serve_in_thread(app: FastAPI, startup_timeout_s: float = 30.0) -> Iterator[str]:
    """Run `app` under a real uvicorn server on a free port; yield its base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)


def wait_ready(url: str, timeout_s: float = 120.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    body: dict[str, Any] = {}
    while time.monotonic() < deadline:
        response = httpx.get(f"{url}/readyz", timeout=5)
        body = response.json()
        if response.status_code == 200:
            return body
        time.sleep(0.25)
    raise AssertionError(f"service not ready in {timeout_s} s: {body}")


@dataclass(frozen=True)
class Event:
    event: str
    data: dict[str, Any]


def parse_sse(raw: str) -> list[Event]:
    """Parse a whole SSE body strictly: every block is `event:` then `data:` lines."""
    events = []
    for block in raw.split("\n\n"):
        if not block.strip():
            continue
        lines = block.split("\n")
        fields = [line.partition(": ") for line in lines if not line.startswith(":")]
        if not fields:
            continue
        name = next(value for key, _, value in fields if key == "event")
        data = "\n".join(value for key, _, value in fields if key == "data")
        events.append(Event(name, json.loads(data)))
    return events


def post_answer(url: str, body: dict[str, Any], timeout_s: float = 120.0) -> httpx.Response:
    return httpx.post(f"{url}/v1/answer", json=body, timeout=timeout_s)


def post_and_leave(
    url: str, body: dict[str, Any], until: Callable[[], bool], timeout_s: float = 60.0
) -> None:
    """POSTs `body` to `url` and closes the connection, unread, once `until()` holds (say, the
    fake SGLang has the request): a client that goes away at the point the test names, not at a
    client timeout that a slow or busy machine can reach before the service gets there."""
    parts = urlsplit(url)
    assert parts.hostname is not None
    assert parts.port is not None
    payload = json.dumps(body).encode()
    head = (
        f"POST {parts.path or '/'} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    )
    with socket.create_connection((parts.hostname, parts.port), timeout=timeout_s) as sock:
        sock.sendall(head.encode() + payload)
        deadline = time.monotonic() + timeout_s
        while not until():
            assert time.monotonic() < deadline, f"the request to {url} never got that far"
            time.sleep(0.01)


def assert_stage_order(spans: list[str]) -> None:
    """Every stage of an answer over whole passages once, in order: the prompt is sent as soon
    as the passages are final, and the sentences, the evidence and the form are decided while
    it is prefilled."""
    assert spans == [
        "answer",
        "embed",
        "search",
        "slot",
        "prompt",
        "generate",
        "sentences",
        "evidence",
        "form",
        "first_token",
    ]
