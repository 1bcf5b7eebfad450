"""How long the service takes to answer, seen on the wire: from a request's first bytes on the
loopback interface to the first bytes of its response, by the kernel's clock.

A load generator on the same two cores as the service measures its own scheduling too: the
time from its send to its read includes waiting for a core and for its own event loop,
which a client on another machine would not add. The kernel stamps each packet as it passes
the interface, whoever reads it later and whenever, so request-to-response on the wire is what
a load balancer in front of the service would see: the service's socket read, HTTP parsing,
its work and its write, and its waits for a core, not the client's.

`LoopbackCapture` reads every TCP packet to or from one port on `lo` (an AF_PACKET socket:
root or CAP_NET_RAW) with its kernel timestamp; `exchanges` pairs them into HTTP/1.1
request/response exchanges per connection (keep-alive, no pipelining: a request is the first
client data after the previous response began).
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from types import TracebackType

_ETH_P_ALL = 0x0003
_ETH_P_IP = 0x0800
_PACKET_OUTGOING = 4  # a loopback packet is seen leaving and arriving: keep the arrival
_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
_ETH_HEADER = 14
_TCP = 6


@dataclass(frozen=True, slots=True)
class Packet:
    """A TCP segment with data, to or from the server's port."""

    at_s: float  # the kernel's timestamp (CLOCK_REALTIME)
    client_port: int
    to_server: bool
    head: bytes  # the first bytes of its data


@dataclass(frozen=True, slots=True)
class Exchange:
    """One request on one connection and the start of its response."""

    client_port: int
    request_s: float
    response_s: float
    status: int | None  # from the status line; None if it could not be read

    @property
    def ms(self) -> float:
        return (self.response_s - self.request_s) * 1000.0


def parse_frame(frame: bytes, port: int, at_s: float) -> Packet | None:
    """The TCP data segment in an Ethernet frame, if it is to or from `port`; None otherwise
    (not IPv4 TCP, another port, or no data: handshakes and acknowledgements)."""
    if len(frame) < _ETH_HEADER + 20 or struct.unpack_from("!H", frame, 12)[0] != _ETH_P_IP:
        return None
    ip = _ETH_HEADER
    ihl = (frame[ip] & 0x0F) * 4
    total = struct.unpack_from("!H", frame, ip + 2)[0]
    if frame[ip + 9] != _TCP:
        return None
    tcp = ip + ihl
    source, destination = struct.unpack_from("!HH", frame, tcp)
    if port not in (source, destination):
        return None
    data = tcp + (frame[tcp + 12] >> 4) * 4
    end = ip + total
    if end <= data:
        return None
    to_server = destination == port
    return Packet(at_s, source if to_server else destination, to_server, frame[data : data + 16])


def _status(head: bytes) -> int | None:
    parts = head.split(b" ", 2)
    if len(parts) >= 2 and parts[0].startswith(b"HTTP/") and parts[1].isdigit():
        return int(parts[1])
    return None


def exchanges(packets: Iterable[Packet]) -> list[Exchange]:
    """Request/response exchanges in the order their requests came, per connection: a request
    begins at the first client data after the previous response began (or the connection's
    first), its response at the first server data after that."""
    open_requests: dict[int, float] = {}
    done: list[Exchange] = []
    for packet in sorted(packets, key=lambda p: p.at_s):
        if packet.to_server:
            open_requests.setdefault(packet.client_port, packet.at_s)
        elif (started := open_requests.pop(packet.client_port, None)) is not None:
            done.append(Exchange(packet.client_port, started, packet.at_s, _status(packet.head)))
    return sorted(done, key=lambda e: e.request_s)


class LoopbackCapture:
    """`with LoopbackCapture(port) as capture: ...`, then `capture.packets`.

    Raises PermissionError when made without root or CAP_NET_RAW.
    """

    def __init__(self, port: int, interface: str = "lo", buffer_bytes: int = 16 << 20) -> None:
        self.port = port
        self.packets: list[Packet] = []
        self._socket = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(_ETH_P_ALL))
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffer_bytes)
        self._socket.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
        self._socket.bind((interface, 0))
        self._socket.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, name="wire-capture", daemon=True)

    def _read(self) -> None:
        ancillary = socket.CMSG_SPACE(16)
        while not self._stop.is_set():
            try:
                frame, cmsgs, _, address = self._socket.recvmsg(256, ancillary)
            except TimeoutError:
                continue
            except OSError:
                return
            if address[2] == _PACKET_OUTGOING:
                continue
            at_s = next(
                (
                    seconds + nanoseconds / 1e9
                    for level, kind, data in cmsgs
                    if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS
                    for seconds, nanoseconds in [struct.unpack("qq", data[:16])]
                ),
                None,
            )
            if at_s is not None and (packet := parse_frame(frame, self.port, at_s)):
                self.packets.append(packet)

    def __enter__(self) -> LoopbackCapture:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)
        self._socket.close()
