"""The router's argv, paths and the fleet's layout are pure functions of their configs."""

from __future__ import annotations

from pathlib import Path

import pytest

from generation.errors import SGLangServerError
from generation.server.fleet import (
    GpuSlot,
    SGLangFleet,
    SGLangFleetConfig,
    consecutive_ports,
    threads_per_worker,
)
from generation.server.launch import SGLangServerConfig
from generation.server.router import SGLangRouter, SGLangRouterConfig, gpu_router_config

PYTHON = Path("/venv/bin/python")
WORKERS = ("http://127.0.0.1:31001", "http://127.0.0.1:31002")


def _options(argv: list[str]) -> dict[str, list[str]]:
    """``--flag v1 v2 --switch`` as ``{"--flag": ["v1", "v2"], "--switch": []}``."""
    options: dict[str, list[str]] = {}
    current: list[str] = []
    for arg in argv:
        if arg.startswith("--"):
            current = options.setdefault(arg, [])
        else:
            current.append(arg)
    return options


def test_cache_aware_command_has_workers_ports_and_tuning() -> None:
    config = SGLangRouterConfig(
        worker_urls=WORKERS,
        port=31000,
        cache_threshold=0.5,
        balance_abs_threshold=0,
        balance_rel_threshold=1.0,
        eviction_interval_s=30,
        max_tree_size=1024,
    )
    argv = SGLangRouter(config).command(PYTHON)

    assert argv[:3] == [str(PYTHON), "-m", "sglang_router.launch_router"]
    assert _options(argv[3:]) == {
        "--host": ["127.0.0.1"],
        "--port": ["31000"],
        "--worker-urls": list(WORKERS),
        "--policy": ["cache_aware"],
        # Upstream binds its metrics to 0.0.0.0:29000 and waits 30 s between worker checks.
        "--prometheus-host": ["127.0.0.1"],
        "--prometheus-port": ["30000"],
        "--worker-startup-check-interval": ["1"],
        "--shutdown-grace-period-secs": ["5"],
        # A lost worker is passed over within seconds, not upstream's minutes.
        "--health-check-interval-secs": ["2"],
        "--health-check-timeout-secs": ["2"],
        "--health-failure-threshold": ["2"],
        "--cb-failure-threshold": ["3"],
        "--cb-timeout-duration-secs": ["10"],
        "--retry-max-retries": ["3"],
        "--retry-initial-backoff-ms": ["20"],
        "--cache-threshold": ["0.5"],
        "--balance-abs-threshold": ["0"],
        "--balance-rel-threshold": ["1.0"],
        "--eviction-interval-secs": ["30"],
        "--max-tree-size": ["1024"],
    }


def test_round_robin_command_has_no_cache_tuning() -> None:
    config = SGLangRouterConfig(worker_urls=WORKERS, policy="round_robin")
    options = _options(SGLangRouter(config).command(PYTHON))

    assert options["--policy"] == ["round_robin"]
    assert not {"--cache-threshold", "--balance-abs-threshold", "--max-tree-size"} & set(options)


def test_metrics_port_and_extra_args() -> None:
    config = SGLangRouterConfig(
        worker_urls=WORKERS[:1], metrics_port=40001, extra_args=("--log-level", "debug")
    )
    router = SGLangRouter(config)
    argv = router.command(PYTHON)

    assert _options(argv)["--prometheus-port"] == ["40001"]
    assert router.metrics_url == "http://127.0.0.1:40001/metrics"
    assert argv[-2:] == ["--log-level", "debug"]


def test_command_is_pure() -> None:
    router = SGLangRouter(SGLangRouterConfig(worker_urls=WORKERS))
    assert router.command(PYTHON) == router.command(PYTHON)


def test_url_and_default_paths(tmp_path: Path) -> None:
    router = SGLangRouter(SGLangRouterConfig(port=30100, cache_dir=tmp_path))

    assert router.url == "http://127.0.0.1:30100"
    assert router.pid_path == tmp_path / "run" / "sglang-router-30100.pid"
    assert router.log_path == tmp_path / "logs" / "sglang-router-30100.log"


def test_start_without_workers_fails_clearly(tmp_path: Path) -> None:
    with pytest.raises(SGLangServerError, match="at least one worker"):
        SGLangRouter(SGLangRouterConfig(cache_dir=tmp_path)).start()


def test_fleet_puts_workers_after_the_router_and_splits_the_cores(tmp_path: Path) -> None:
    fleet = SGLangFleet(
        SGLangFleetConfig(
            worker=SGLangServerConfig(cache_dir=tmp_path, device="cpu"),
            router=SGLangRouterConfig(port=30200, cache_dir=tmp_path),
            worker_ports=consecutive_ports(30201, 2),
            log_dir=tmp_path / "logs",
        )
    )

    assert fleet.url == "http://127.0.0.1:30200"
    assert fleet.worker_urls == ("http://127.0.0.1:30201", "http://127.0.0.1:30202")
    assert fleet.router.config.worker_urls == fleet.worker_urls
    assert fleet.router.log_path == tmp_path / "logs" / "sglang-router-30200.log"
    assert [w.log_path.name for w in fleet.workers] == ["sglang-30201.log", "sglang-30202.log"]
    env = fleet.workers[0].environment({}, "cpu")
    assert env["OMP_NUM_THREADS"] == str(threads_per_worker(2))


def test_gpu_router_has_upstream_gpu_tuning_and_upstream_defaults_unsaid() -> None:
    config = gpu_router_config(worker_urls=WORKERS, port=31000)
    options = _options(SGLangRouter(config).command(PYTHON))

    assert config.venv == "cuda"
    assert options["--balance-abs-threshold"] == ["64"]
    assert options["--worker-startup-check-interval"] == ["5"]
    assert options["--shutdown-grace-period-secs"] == ["30"]
    assert options["--cb-timeout-duration-secs"] == ["30"]
    assert not {"--eviction-interval-secs", "--max-tree-size"} & set(options)


def test_fleet_gives_each_gpu_worker_its_gpu_and_share(tmp_path: Path) -> None:
    fleet = SGLangFleet(
        SGLangFleetConfig(
            worker=SGLangServerConfig(cache_dir=tmp_path, device="cuda", model="org/model"),
            router=gpu_router_config(port=30300, cache_dir=tmp_path),
            worker_ports=consecutive_ports(30301, 2),
            gpu_slots=(GpuSlot(2, 0.7), GpuSlot(3)),
        )
    )

    assert [(w.config.gpu_id, w.config.mem_fraction_static) for w in fleet.workers] == [
        (2, 0.7),
        (3, None),
    ]
    assert [w.config.model for w in fleet.workers] == ["org/model", "org/model"]
    assert fleet.workers[0].environment({}, "cuda")["CUDA_VISIBLE_DEVICES"] == "2"
    with pytest.raises(SGLangServerError, match="2 workers but 1 GPU slots"):
        SGLangFleetConfig(
            worker=SGLangServerConfig(cache_dir=tmp_path),
            router=SGLangRouterConfig(cache_dir=tmp_path),
            worker_ports=(1, 2),
            gpu_slots=(GpuSlot(0),),
        )


def test_threads_per_worker() -> None:
    assert threads_per_worker(2, cores=2) == 1
    assert threads_per_worker(3, cores=2) == 1
    assert threads_per_worker(2, cores=16) == 8


def test_find_reads_nothing_without_a_record(tmp_path: Path) -> None:
    assert SGLangFleet.find(tmp_path, 30000) is None
