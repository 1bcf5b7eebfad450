"""Run `sglang-router` in front of SGLang workers, as a child process group found again
through a pid file (like `SGLangServer`).

The router is PyPI's ``sglang-router`` 0.3.2 (`sglang_env.SGLANG_ROUTER_PACKAGE`): a Rust
server (it calls itself ``smg``) behind ``python -m sglang_router.launch_router``, installed
into SGLang's venv by `ensure_sglang_router`. What it does, measured over two CPU workers of
SGLang 0.5.23 (tests/integration/test_sglang_router.py checks the parts we rely on):

Proxied to one worker
    ``/generate`` plain and streamed (the SSE body passes through unchanged, so
    ``meta_info.cached_tokens`` and the caller's ``rid`` as ``meta_info.id`` arrive as the worker
    wrote them), ``/v1/chat/completions``, ``/v1/completions``, ``/get_model_info``.
Answered by the router
    ``/health`` and ``/liveness`` (200 "OK" always, even with no healthy worker),
    ``/readiness`` (200 ``{"status": "ready", "healthy_workers": n, "total_workers": m}``, 503
    until a worker is registered), ``/health_generate``, ``/workers`` (url, health and in-flight
    ``load`` of each), ``/get_loads``, ``/get_server_info``, ``/v1/models``, ``/engine_metrics``
    (every worker's Prometheus text, labelled ``worker_addr``); ``/flush_cache`` fans out to
    all workers.
Not there (404)
    ``/ready`` (`SGLangClient.health` then falls back to ``/health``, which the router answers
    without asking a worker), ``/abort_request`` (sglang issue #6531), ``/metrics``.
Abort
    Closing the stream to the router closes its upstream connection and the worker aborts the
    request, so a client that goes away stops the work (measured: the worker's decoding
    stopped 0.09 s after the close). An explicit abort must go to the workers (sent to the
    router it is a 404 and the worker decodes on): ``POST /abort_request {"rid": ...}``
    answers 200 on a worker that does not hold the rid, so sending it to every worker is safe
    (`SGLangClient.abort` does, with the list from ``/workers``; decoding stopped 0.08 s after).
Which worker served a request
    Nothing in the response says (the only added header is the router's own
    ``x-request-id``). The router's Prometheus text (``--prometheus-port``, default 29000 on
    0.0.0.0; a port in use makes the router panic at start) counts
    ``smg_worker_cb_outcomes_total{worker=URL,outcome="success"}`` per worker; its debug log
    says ``Sending request url=...``; each worker's ``/metrics`` counts
    ``sglang:prompt_tokens_total``.
``cache_aware`` in 0.3.2
    One radix tree of request *characters* per worker, fed with what was sent there (the
    workers' real caches are not consulted). While loads (in-flight requests counted by the
    router) are balanced, a request whose longest match exceeds ``cache_threshold`` of its
    text goes to that worker; a lower match went, in every run, to the first worker the router
    registered, idle or not. Loads count as imbalanced when ``max - min >
    balance_abs_threshold`` and ``max > min * balance_rel_threshold``; then the least-loaded
    worker gets the request whatever the cache. Upstream's threshold of 64 requests suits GPU
    workers; a CPU worker runs a few at once, so the default here spreads load sooner.
A worker lost
    The router retries a request whose worker cannot be reached up to ``--retry-max-retries``
    times on that same worker (the policy chooses again and chooses it), then answers 500
    ``{"error": {"code": "call_upstream_request_error"}}`` (`SGLangClient` raises
    `WorkerLostError` for it). Those failures open the worker's circuit breaker, so the next
    request goes to another worker; failed health checks then drop it from ``/readiness``.
Start and stop
    Workers are registered in the background after start (``/readiness`` tells when), and a
    worker that is not up yet is retried every ``--worker-startup-check-interval`` (default
    30 s; 1 s here). SIGTERM waits for in-flight requests up to
    ``--shutdown-grace-period-secs`` (default 180 s; 5 s here).

Every failure raises `SGLangServerError` with the router's log tail.
"""

from __future__ import annotations

import json
import logging
import os
import urllib.error
import urllib.request
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from generation.errors import SGLangServerError
from generation.server.env import Accelerator, ensure_sglang_router
from generation.server.process_group import PidFileProcess, port_in_use

logger = logging.getLogger(__name__)

RouterPolicy = Literal["cache_aware", "round_robin", "random"]


@dataclass(frozen=True, slots=True)
class SGLangRouterConfig:
    worker_urls: tuple[str, ...] = ()
    host: str = "127.0.0.1"
    port: int = 30000
    policy: RouterPolicy = "cache_aware"
    cache_dir: Path = field(default_factory=lambda: Path.home() / ".cache" / "answer-service")
    log_path: Path | None = None
    # The router's own Prometheus text; None: port - 1000 (29000 for 30000, upstream's default).
    metrics_port: int | None = None
    startup_timeout_s: float = 120.0
    shutdown_grace_s: int = 5
    # How often a worker that is not up yet is tried again (upstream: 30 s).
    worker_startup_check_interval_s: int = 1
    # cache_aware only (see the module docstring for what each does in 0.3.2); None: not
    # passed, upstream's default.
    cache_threshold: float = 0.3
    balance_abs_threshold: int = 1
    balance_rel_threshold: float = 1.5
    eviction_interval_s: int | None = 60
    max_tree_size: int | None = 1 << 26
    # A worker that dies: upstream checks health every 60 s and marks a worker down after 3
    # failures, so a dead CPU worker would be tried for minutes. Here it is passed over once
    # two checks 2 s apart fail, or once 3 attempts to reach it fail (its circuit opens for
    # `cb_timeout_s`). The router's retries go to the same worker, so the request that met
    # the dead worker still fails (500 `call_upstream_request_error`, after ~50 ms of
    # backoff); the service asks the router once more (answer_service/pipeline/answer_pipeline.py).
    health_check_interval_s: int = 2
    health_check_timeout_s: int = 2
    health_failure_threshold: int = 2
    cb_failure_threshold: int = 3
    cb_timeout_s: int = 10
    retry_max_retries: int = 3
    retry_initial_backoff_ms: int = 20
    extra_args: tuple[str, ...] = ()
    # Which of SGLang's venvs the router is installed into (the one its workers run from).
    venv: Accelerator = "cpu"


def gpu_router_config(**overrides: Any) -> SGLangRouterConfig:
    """The router in front of GPU workers, tuned as ``docker/compose.yaml``'s ``sgl-router``
    (tests/unit/test_docker_compose.py holds the two together): upstream's balance threshold
    for GPU workers, which run many requests at once, and a lost worker passed over after two
    failed checks 5 s apart."""
    gpu = SGLangRouterConfig(
        worker_startup_check_interval_s=5,
        shutdown_grace_s=30,
        balance_abs_threshold=64,
        eviction_interval_s=None,
        max_tree_size=None,
        health_check_interval_s=5,
        health_check_timeout_s=3,
        cb_timeout_s=30,
        venv="cuda",
    )
    return replace(gpu, **overrides)


class SGLangRouter:
    """One sglang-router process group, found again across processes through a pid file."""

    def __init__(self, config: SGLangRouterConfig) -> None:
        self._config = config
        self._process = PidFileProcess("sglang-router", self.pid_path, self.log_path, b"router")

    @property
    def config(self) -> SGLangRouterConfig:
        return self._config

    @property
    def url(self) -> str:
        return f"http://{self._config.host}:{self._config.port}"

    @property
    def metrics_port(self) -> int:
        cfg = self._config
        return cfg.metrics_port if cfg.metrics_port is not None else cfg.port - 1000

    @property
    def metrics_url(self) -> str:
        return f"http://{self._config.host}:{self.metrics_port}/metrics"

    @property
    def pid_path(self) -> Path:
        return self._config.cache_dir / "run" / f"sglang-router-{self._config.port}.pid"

    @property
    def log_path(self) -> Path:
        default = self._config.cache_dir / "logs" / f"sglang-router-{self._config.port}.log"
        return self._config.log_path or default

    def command(self, python: Path) -> list[str]:
        """The router's argv; pure."""
        cfg = self._config
        argv = [
            str(python),
            "-m",
            "sglang_router.launch_router",
            "--host",
            cfg.host,
            "--port",
            str(cfg.port),
            "--worker-urls",
            *cfg.worker_urls,
            "--policy",
            cfg.policy,
            "--prometheus-host",
            cfg.host,
            "--prometheus-port",
            str(self.metrics_port),
            "--worker-startup-check-interval",
            str(cfg.worker_startup_check_interval_s),
            "--shutdown-grace-period-secs",
            str(cfg.shutdown_grace_s),
            "--health-check-interval-secs",
            str(cfg.health_check_interval_s),
            "--health-check-timeout-secs",
            str(cfg.health_check_timeout_s),
            "--health-failure-threshold",
            str(cfg.health_failure_threshold),
            "--cb-failure-threshold",
            str(cfg.cb_failure_threshold),
            "--cb-timeout-duration-secs",
            str(cfg.cb_timeout_s),
            "--retry-max-retries",
            str(cfg.retry_max_retries),
            "--retry-initial-backoff-ms",
            str(cfg.retry_initial_backoff_ms),
        ]
        if cfg.policy == "cache_aware":
            argv += [
                "--cache-threshold",
                str(cfg.cache_threshold),
                "--balance-abs-threshold",
                str(cfg.balance_abs_threshold),
                "--balance-rel-threshold",
                str(cfg.balance_rel_threshold),
            ]
            if cfg.eviction_interval_s is not None:
                argv += ["--eviction-interval-secs", str(cfg.eviction_interval_s)]
            if cfg.max_tree_size is not None:
                argv += ["--max-tree-size", str(cfg.max_tree_size)]
        return argv + list(cfg.extra_args)

    def healthy_workers(self, timeout_s: float = 2.0) -> int | None:
        """How many workers the router routes to now; None if it does not answer."""
        try:
            with urllib.request.urlopen(f"{self.url}/readiness", timeout=timeout_s) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return 0 if exc.code == 503 else None
        except (urllib.error.URLError, OSError, ValueError):
            return None
        count = body.get("healthy_workers") if isinstance(body, dict) else None
        return count if isinstance(count, int) else None

    def is_healthy(self, timeout_s: float = 2.0) -> bool:
        """Whether the router answers and routes to every one of its workers."""
        count = self.healthy_workers(timeout_s)
        return count is not None and count >= len(self._config.worker_urls)

    def start(self) -> str:
        """Install the router if needed, spawn it and wait until every worker is registered;
        return its url. The workers must be running already."""
        cfg = self._config
        if not cfg.worker_urls:
            raise SGLangServerError("sglang-router needs at least one worker url")
        pid = self._process.running_pid()
        if pid is not None:
            if self.is_healthy():
                logger.info("sglang-router already running url=%s pid=%d", self.url, pid)
                return self.url
            raise SGLangServerError(
                f"sglang-router pid {pid} from {self.pid_path} is running but does not route to "
                f"all of {', '.join(cfg.worker_urls)}; stop() it first. Log {self.log_path}"
            )
        self.pid_path.unlink(missing_ok=True)
        for port in (cfg.port, self.metrics_port):
            if port_in_use(cfg.host, port):
                raise SGLangServerError(
                    f"port {port} is in use by a process this service did not start"
                )
        python = ensure_sglang_router(cfg.cache_dir, cfg.venv)
        logger.info(
            "sglang-router starting url=%s policy=%s workers=%d log=%s",
            self.url,
            cfg.policy,
            len(cfg.worker_urls),
            self.log_path,
        )
        self._process.spawn(self.command(python), dict(os.environ))
        startup_s = self._process.wait_ready(lambda _: self.is_healthy(), cfg.startup_timeout_s)
        logger.info("sglang-router ready url=%s startup_s=%.1f", self.url, startup_s)
        return self.url

    def stop(self, timeout_s: float = 15.0) -> bool:
        """SIGTERM the router, SIGKILL after timeout_s; True if something was stopped."""
        return self._process.stop(timeout_s)
