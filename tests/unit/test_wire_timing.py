"""Response times on the wire (docs/benchmarks/wire_timing.py): frames parsed, requests paired with their
responses per keep-alive connection, and a real capture on the loopback interface."""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from docs.benchmarks.wire_timing import LoopbackCapture, Packet, exchanges, parse_frame

PORT = 8123


def _frame(source: int, destination: int, data: bytes, protocol: int = 6) -> bytes:
    tcp = struct.pack("!HHIIBBHHH", source, destination, 1, 1, 5 << 4, 0x18, 65535, 0, 0)
    total = 20 + len(tcp) + len(data)
    ip = struct.pack(
        "!BBHHHBBH4s4s", 0x45, 0, total, 0, 0, 64, protocol, 0, b"\x7f\0\0\1", b"\x7f\0\0\1"
    )
    return b"\0" * 12 + b"\x08\x00" + ip + tcp + data + b"\0" * 4  # padding past the IP length


def test_a_frame_gives_its_connection_direction_and_first_bytes() -> None:
    request = parse_frame(_frame(50000, PORT, b"POST /v1/answer HTTP/1.1\r\n"), PORT, 1.5)
    assert request == Packet(1.5, 50000, True, b"POST /v1/answer ")
    response = parse_frame(_frame(PORT, 50000, b"HTTP/1.1 503 Service Unavailable"), PORT, 2.0)
    assert response == Packet(2.0, 50000, False, b"HTTP/1.1 503 Ser")
    assert parse_frame(_frame(50000, PORT, b""), PORT, 1.0) is None  # an acknowledgement
    assert parse_frame(_frame(50000, 9999, b"GET /"), PORT, 1.0) is None  # another port
    assert parse_frame(_frame(50000, PORT, b"x", protocol=17), PORT, 1.0) is None  # UDP
    assert parse_frame(b"\0" * 12 + b"\x86\xdd" + b"\0" * 60, PORT, 1.0) is None  # IPv6


def test_requests_pair_with_their_responses_per_connection() -> None:
    packets = [
        Packet(0.000, 1, True, b"POST /v1/answer "),
        Packet(0.001, 1, True, b'{"query": "a lo'),  # the same request's body
        Packet(0.002, 2, True, b"POST /v1/answer "),
        Packet(0.006, 2, False, b"HTTP/1.1 503 Ser"),
        Packet(0.300, 1, False, b"HTTP/1.1 200 OK\r"),
        Packet(0.350, 1, False, b"event: token\r\nda"),  # the stream goes on
        Packet(0.900, 2, True, b"POST /v1/answer "),  # keep-alive: the next request
        Packet(0.903, 2, False, b"HTTP/1.1 429 Too"),
        Packet(0.950, 3, True, b"POST /v1/answer "),  # no response yet: not an exchange
    ]
    seen = exchanges(reversed(packets))  # arrival order does not matter
    assert [(e.client_port, e.status, round(e.ms, 3)) for e in seen] == [
        (1, 200, 300.0),
        (2, 503, 4.0),
        (2, 429, 3.0),
    ]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["content-length"]))
        refused = self.path == "/refuse"
        time.sleep(0.002 if refused else 0.1)
        body = b"{}" if refused else b"x" * 20_000
        self.send_response(503 if refused else 200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def server_port() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


def test_a_real_capture_times_each_response_on_the_loopback(server_port: int) -> None:
    try:
        capture = LoopbackCapture(server_port)
    except PermissionError:
        pytest.skip("capturing on the loopback interface needs root or CAP_NET_RAW")
    with capture, httpx.Client() as client:
        for n in range(10):
            path = "/refuse" if n % 2 else "/answer"
            response = client.post(f"http://127.0.0.1:{server_port}{path}", json={"q": "x" * 3000})
            assert response.status_code == (503 if n % 2 else 200)
        time.sleep(0.3)
    seen = exchanges(capture.packets)
    assert [e.status for e in seen] == [200, 503] * 5
    assert len({e.client_port for e in seen}) == 1  # one keep-alive connection
    answered = [e.ms for e in seen if e.status == 200]
    refused = [e.ms for e in seen if e.status == 503]
    assert min(answered) >= 100  # the handler's 100 ms
    assert min(refused) >= 2  # its 2 ms
    assert max(refused) < min(answered)
