"""Several SGLang workers and `sglang-router` in front of them, started and stopped together.

The workers are `SGLangServer`s on their own ports (`consecutive_ports` for the usual layout:
the router on P, the workers on P+1..P+N); the router is an `SGLangRouter` over their urls.
Callers talk to the router's url as they would to one SGLang server (see `sglang_router` for
what it forwards and what it does not). On the CPU the workers share the cores, so each gets
``cores // N`` torch threads unless the worker config says otherwise; on GPUs each worker gets a
GPU of its own (`GpuSlot`), as compose gives each worker container one.

A small record under ``cache_dir/run`` names the fleet's ports, so another process (the CLI's
``sglang down``) can find and stop it. Failures raise `SGLangServerError`; a fleet that fails
to start is stopped again.
"""

from __future__ import annotations

import json
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from generation.errors import SGLangServerError
from generation.server.env import ensure_sglang_router
from generation.server.host import HostFacts, detect_host
from generation.server.launch import SGLangServer, SGLangServerConfig
from generation.server.router import SGLangRouter, SGLangRouterConfig

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class GpuSlot:
    """One GPU worker's GPU, and its share of it (None: SGLang's own choice)."""

    gpu_id: int
    mem_fraction_static: float | None = None


@dataclass(frozen=True, slots=True)
class SGLangFleetConfig:
    """``worker`` is every worker's config except its port (and its log, placed in
    ``log_dir``, and on GPUs its `GpuSlot`, in worker order); ``router`` is the router's except
    its worker urls. Both should name the same ``cache_dir`` and host."""

    worker: SGLangServerConfig
    router: SGLangRouterConfig
    worker_ports: tuple[int, ...]
    log_dir: Path | None = None
    gpu_slots: tuple[GpuSlot, ...] = ()

    def __post_init__(self) -> None:
        if self.gpu_slots and len(self.gpu_slots) != len(self.worker_ports):
            raise SGLangServerError(
                f"{len(self.worker_ports)} workers but {len(self.gpu_slots)} GPU slots"
            )


def consecutive_ports(base_port: int, count: int) -> tuple[int, ...]:
    return tuple(range(base_port, base_port + count))


def threads_per_worker(workers: int, cores: int | None = None) -> int:
    """Torch threads for each of ``workers`` CPU workers sharing ``cores`` (default: ours)."""
    available = cores if cores is not None else len(os.sched_getaffinity(0))
    return max(1, available // max(1, workers))


class SGLangFleet:
    def __init__(self, config: SGLangFleetConfig) -> None:
        if not config.worker_ports:
            raise SGLangServerError("a fleet needs at least one worker port")
        self._config = config
        self._workers = self._make_workers(config.worker.model_dir)
        router_config = replace(
            config.router,
            worker_urls=tuple(worker.url for worker in self._workers),
            log_path=self._log_path(f"sglang-router-{config.router.port}.log")
            or config.router.log_path,
        )
        self._router = SGLangRouter(router_config)

    @property
    def url(self) -> str:
        """Where callers send requests: the router."""
        return self._router.url

    @property
    def router(self) -> SGLangRouter:
        return self._router

    @property
    def workers(self) -> tuple[SGLangServer, ...]:
        return self._workers

    @property
    def worker_urls(self) -> tuple[str, ...]:
        return tuple(worker.url for worker in self._workers)

    @property
    def record_path(self) -> Path:
        return (
            self._config.router.cache_dir / "run" / f"sglang-fleet-{self._router.config.port}.json"
        )

    def _log_path(self, name: str) -> Path | None:
        return self._config.log_dir / name if self._config.log_dir is not None else None

    def _make_workers(self, model_dir: Path | None) -> tuple[SGLangServer, ...]:
        template = self._config.worker
        threads = template.cpu_threads or threads_per_worker(len(self._config.worker_ports))
        slots = self._config.gpu_slots or (None,) * len(self._config.worker_ports)
        return tuple(
            SGLangServer(
                replace(
                    template,
                    port=port,
                    model_dir=model_dir,
                    cpu_threads=threads,
                    log_path=self._log_path(f"sglang-{port}.log"),
                    gpu_id=slot.gpu_id if slot else template.gpu_id,
                    mem_fraction_static=slot.mem_fraction_static
                    if slot
                    else template.mem_fraction_static,
                )
            )
            for port, slot in zip(self._config.worker_ports, slots, strict=True)
        )

    def start(self, host: HostFacts | None = None) -> str:
        """Start the workers (together), then the router; return the router's url.
        Idempotent: parts already running are kept. `host`: detected when not given."""
        if self._router.is_healthy():
            logger.info("sglang fleet already running url=%s", self.url)
            return self.url
        cache_dir = self._config.worker.cache_dir
        host = host or detect_host()
        device = self._workers[0].resolved_device(host)
        # Build the venv and the model once here, not in each worker's thread at the same time.
        ensure_sglang_router(cache_dir, device)
        # A hub id stays in the workers' config (`model` wins); a folder is built here once.
        model = self._workers[0].model_or_default(device)
        self._workers = self._make_workers(model if isinstance(model, Path) else None)
        self._router = SGLangRouter(replace(self._router.config, venv=device))
        try:
            with ThreadPoolExecutor(len(self._workers), thread_name_prefix="sglang-start") as pool:
                list(pool.map(lambda worker: worker.start(host), self._workers))
            self._router.start()
        except SGLangServerError:
            self.stop()
            raise
        self._write_record()
        logger.info("sglang fleet ready url=%s workers=%s", self.url, ",".join(self.worker_urls))
        return self.url

    def stop(self, timeout_s: float = 15.0) -> bool:
        """Stop the router, then the workers (together: SGLang takes ~5 s to shut down);
        True if anything was stopped."""
        stopped = self._router.stop(timeout_s)
        with ThreadPoolExecutor(len(self._workers), thread_name_prefix="sglang-stop") as pool:
            workers_stopped = list(pool.map(lambda worker: worker.stop(timeout_s), self._workers))
        self.record_path.unlink(missing_ok=True)
        return stopped or any(workers_stopped)

    def _write_record(self) -> None:
        record = {
            "host": self._router.config.host,
            "router_port": self._router.config.port,
            "worker_ports": list(self._config.worker_ports),
        }
        self.record_path.parent.mkdir(parents=True, exist_ok=True)
        self.record_path.write_text(json.dumps(record) + "\n")

    @classmethod
    def find(cls, cache_dir: Path, router_port: int) -> SGLangFleet | None:
        """The fleet whose router was started on router_port (by any process), if recorded."""
        path = cache_dir / "run" / f"sglang-fleet-{router_port}.json"
        try:
            record = json.loads(path.read_text())
            host = str(record["host"])
            worker_ports = tuple(int(port) for port in record["worker_ports"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return cls(
            SGLangFleetConfig(
                worker=SGLangServerConfig(host=host, cache_dir=cache_dir),
                router=SGLangRouterConfig(host=host, port=router_port, cache_dir=cache_dir),
                worker_ports=worker_ports,
            )
        )
