"""The answer service as a child process group, for benchmarks that run it in several
configurations: `answer-service serve` with an environment of the benchmark's choosing, ready
once `/readyz` answers 200 (and, where a reranker is wanted, once it has loaded), stopped with
every process it spawned (`generation/server/process_group.py`).

Errors: a reranker the service reports as unavailable raises `ServiceStartError`; a service
that exits or is not ready in time raises `SGLangServerError` (from the process-group
mechanism) with its log's tail.
"""

from __future__ import annotations

import json
import socket
import sys
import urllib.error
import urllib.request
from functools import partial
from pathlib import Path

from generation.server.process_group import PidFileProcess

# `/readyz`'s `reranker` while the model has not loaded yet (answer_service/runtime/components.py).
_RERANKER_PENDING = ("loading", "not loaded")


class ServiceStartError(Exception):
    """The service came up, but not as the benchmark asked for."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _readyz(url: str, timeout_s: float) -> tuple[int, dict[str, object]]:
    """`/readyz`'s status and body; (0, {}) when it does not answer."""
    try:
        with urllib.request.urlopen(f"{url}/readyz", timeout=timeout_s) as response:
            return int(response.status), json.loads(response.read())
    except urllib.error.HTTPError as exc:
        try:
            return exc.code, json.loads(exc.read())
        except ValueError:
            return exc.code, {}
    except (urllib.error.URLError, OSError, ValueError):
        return 0, {}


class ServiceProcess:
    """One `answer-service serve` on 127.0.0.1:`port`, its log and pid file in `scratch`."""

    def __init__(
        self,
        name: str,
        *,
        port: int,
        index_dir: Path,
        sglang_url: str,
        env: dict[str, str],
        scratch: Path,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.port = port
        self._extra_args = extra_args
        self._index_dir = index_dir
        self._sglang_url = sglang_url
        self._env = env
        self._process = PidFileProcess(
            f"answer-service ({name})",
            scratch / f"service-{name}.pid",
            scratch / f"service-{name}.log",
            b"answer",
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self._process.log_path

    def command(self) -> list[str]:
        """The venv's `answer-service` console script (the module where there is none)."""
        script = Path(sys.executable).with_name("answer-service")
        program = (
            [str(script)] if script.is_file() else [sys.executable, "-m", "answer_service.cli.main"]
        )
        return [
            *program,
            "serve",
            "--index",
            str(self._index_dir),
            "--port",
            str(self.port),
            "--sglang-url",
            self._sglang_url,
            *self._extra_args,
        ]

    def start(self, *, needs_reranker: bool, timeout_s: float = 600.0) -> str:
        """Spawn the service and wait until it is ready; return its URL."""
        self._process.spawn(self.command(), self._env)
        self._process.wait_ready(partial(self._ready, needs_reranker), timeout_s)
        return self.url

    def _ready(self, needs_reranker: bool, remaining_s: float) -> bool:
        status, body = _readyz(self.url, min(remaining_s, 5.0))
        if status != 200:
            return False
        reranker = str(body.get("reranker", ""))
        if not needs_reranker or reranker.startswith(_RERANKER_PENDING):
            return not needs_reranker
        if reranker.startswith(("unavailable", "disabled")):
            raise ServiceStartError(
                f"the service's reranker is {reranker!r}; pass a loadable model "
                f"(hub id or folder) with --reranker. Log {self.log_path}"
            )
        return True

    def stop(self) -> bool:
        """SIGTERM the service's process group (SIGKILL if it lingers); True if one ran."""
        return self._process.stop()
