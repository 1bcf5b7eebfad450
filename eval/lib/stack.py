"""The stack a benchmark runs: SGLang on the CPU (`SGLangStack`, started on first use), the
answer service as a child process group (`ServiceProcess`: `answer-service serve` with an
environment of the benchmark's choosing, ready once `/readyz` answers 200 and, where a reranker
is wanted, once it has loaded; stopped with every process it spawned,
`generation/server/process_group.py`), SGLang's cache flush between levels, free ports, and the
command-line options every such benchmark shares.

Errors: a reranker the service reports as unavailable raises `ServiceStartError`; a service
that exits or is not ready in time raises `SGLangServerError` (from the process-group
mechanism) with its log's tail.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import TypeVar

from generation.server.launch import SGLangServer, SGLangServerConfig, ensure_smollm2_model
from generation.server.process_group import PidFileProcess

logger = logging.getLogger(__name__)

T = TypeVar("T")

# `/readyz`'s `reranker` while the model has not loaded yet (answer_service/runtime/components.py).
_RERANKER_PENDING = ("loading", "not loaded")


class ServiceStartError(Exception):
    """The service came up, but not as the benchmark asked for."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def flush_cache(url: str, tries: int = 60) -> None:
    """Empty SGLang's prefix cache (so no level starts on what an earlier one cached). SGLang
    answers 400 while it still holds requests (the tail of a level's last answers): try again
    once a second, and go on unflushed, saying so, after `tries`."""
    request = urllib.request.Request(f"{url}/flush_cache", method="POST")
    for _ in range(tries):
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                response.read()
            return
        except urllib.error.HTTPError as exc:
            if exc.code != 400:
                raise
        time.sleep(1.0)
    logger.warning("SGLang cache not flushed: requests still running after %d s", tries)


def service_environment(
    base: Mapping[str, str] | None, *settings: Mapping[str, str]
) -> dict[str, str]:
    """`base` (this process's environment by default) less its `ANSWER_` variables, then
    `settings` in order: a benchmark's service runs on what the benchmark sets, not on the
    caller's shell. No answer comes from the answer cache unless a setting asks for one."""
    base = os.environ if base is None else base
    env = {key: value for key, value in base.items() if not key.startswith("ANSWER_")}
    env["ANSWER_ANSWER_CACHE_TTL_S"] = "0"
    for more in settings:
        env.update(more)
    return env


class SGLangStack:
    """One SGLang worker serving SmolLM2 on the CPU, started on first use (a fully
    checkpointed run starts nothing); `close` stops it."""

    def __init__(self, scratch: Path, max_total_tokens: int, cpu_threads: int | None) -> None:
        self.scratch = scratch
        self._max_total_tokens = max_total_tokens
        self._cpu_threads = cpu_threads
        self._server: SGLangServer | None = None

    def url(self) -> str:
        if self._server is None:
            model_dir = ensure_smollm2_model(SGLangServerConfig().cache_dir)
            self._server = SGLangServer(
                SGLangServerConfig(
                    port=free_port(),
                    device="cpu",
                    model_dir=model_dir,
                    max_total_tokens=self._max_total_tokens,
                    cpu_threads=self._cpu_threads,
                    log_path=self.scratch / "sglang.log",
                )
            )
            self._server.start()
        return self._server.url

    def close(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None


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


def positive_numbers(text: str) -> list[float]:
    """`A,B,C` as sorted distinct positive numbers (an argparse type)."""
    values = sorted({float(part) for part in text.split(",") if part.strip()})
    if not values or values[0] <= 0:
        raise argparse.ArgumentTypeError(f"expected positive numbers: {text!r}")
    return values


def named(registry: Mapping[str, T]) -> Callable[[str], list[T]]:
    """An argparse type: `a,b` as the registry's entries of those names, in that order."""

    def parse(text: str) -> list[T]:
        names = [part.strip() for part in text.split(",") if part.strip()]
        unknown = [name for name in names if name not in registry]
        if unknown or not names:
            raise argparse.ArgumentTypeError(
                f"configurations are among {sorted(registry)}: {text!r}"
            )
        return [registry[name] for name in dict.fromkeys(names)]

    return parse


def assignment(text: str) -> tuple[str, str]:
    """`KEY=VALUE` (an argparse type)."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE: {text!r}")
    return key, value


def add_stack_options(parser: argparse.ArgumentParser) -> None:
    """The options of the stack a benchmark starts: request bounds, SGLang's cache and
    threads, and extra settings for every configuration's service."""
    parser.add_argument("--request-timeout-s", type=float, default=60.0)
    parser.add_argument("--max-in-flight", type=int, default=256)
    parser.add_argument("--max-total-tokens", type=int, default=16384, help="SGLang's KV cache")
    parser.add_argument("--cpu-threads", type=int, help="SGLang's torch threads (default: all)")
    add_service_options(parser)


def add_service_options(parser: argparse.ArgumentParser) -> None:
    """A setting (`--service-env KEY=VALUE`) and an eval knob (`--experiment KEY=VALUE`, serve's
    own flag: answer_service/runtime/configs.py) for every service started, each repeatable."""
    parser.add_argument("--service-env", type=assignment, action="append", default=[])
    parser.add_argument("--experiment", action="append", default=[])
