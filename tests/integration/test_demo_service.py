"""`answer-service demo` starts the service as a process of its own and waits for /readyz: a
warm-up that failed is reported with its reason at once, and the process does not stay on the
port."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from answer_service.cli import demo
from answer_service.runtime.settings import Settings
from tests.support import free_port


def test_a_failed_warm_up_stops_the_wait_with_its_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without the check the wait would run to this timeout and say only that it timed out.
    monkeypatch.setattr(demo, "_READY_TIMEOUT_S", 120.0)
    settings = Settings(cache_dir=tmp_path / "cache")
    port = free_port()
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="cannot start: warm-up failed: no index at"):
        demo._start_service(settings, tmp_path / "none", port, "http://127.0.0.1:9")
    assert time.monotonic() - started < 120.0
    assert not demo._pid_file(settings.cache_dir, port).exists()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        assert sock.connect_ex(("127.0.0.1", port)) != 0  # nothing left listening
