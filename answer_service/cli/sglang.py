"""`answer-service sglang setup | up | down`: a local SGLang server, or workers behind sgl-router.

On a GPU machine `up` launches stock SGLang as ``docker/compose.yaml`` does (one GPU per
worker, the router tuned as compose's), leaving room on a GPU that the service's own models
share (answer_service/runtime/placement.py); on the CPU, the CPU build with its stand-ins.
`launcher` is a pure function of the settings, the host's facts and the arguments, so the GPU
launch is tested without a GPU (tests/unit/test_docker_compose.py); `answer-service demo`
starts its server through it too.
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import replace
from typing import Any, Literal

from answer_service.runtime.placement import PlacementError, plan_placement, plan_sglang_workers
from answer_service.runtime.settings import DEFAULT_SGLANG_PORT, Settings
from generation.server.env import ensure_sglang_env, ensure_sglang_router, ensure_smollm2_model
from generation.server.fleet import GpuSlot, SGLangFleet, SGLangFleetConfig, consecutive_ports
from generation.server.host import HostFacts, detect_host
from generation.server.launch import SGLangServer, SGLangServerConfig, SGLangServerError
from generation.server.router import RouterPolicy, SGLangRouterConfig, gpu_router_config

logger = logging.getLogger(__name__)


def launcher(
    settings: Settings,
    host: HostFacts,
    *,
    port: int,
    model: str | None = None,
    workers: int = 1,
    bind: str = "127.0.0.1",
    router_policy: RouterPolicy = "cache_aware",
) -> SGLangServer | SGLangFleet:
    """What `sglang up` starts on a machine with these facts: one server on `port`, or
    `workers` behind a router on it; pure (raises PlacementError)."""
    gpu_count = len(host.gpus)
    slots = plan_sglang_workers(settings, plan_placement(settings, gpu_count), workers, gpu_count)
    gpu_slots = tuple(GpuSlot(slot.gpu, slot.mem_fraction_static) for slot in slots)
    worker = SGLangServerConfig(
        host=bind,
        port=port,
        cache_dir=settings.cache_dir,
        model=model,
        device="cuda" if gpu_slots else "cpu",
    )
    if workers == 1:
        if gpu_slots:
            (slot,) = gpu_slots
            worker = replace(
                worker, gpu_id=slot.gpu_id, mem_fraction_static=slot.mem_fraction_static
            )
        return SGLangServer(worker)
    router_fields: dict[str, Any] = {
        "host": bind,
        "port": port,
        "policy": router_policy,
        "cache_dir": settings.cache_dir,
    }
    return SGLangFleet(
        SGLangFleetConfig(
            worker=worker,
            router=gpu_router_config(**router_fields)
            if gpu_slots
            else SGLangRouterConfig(**router_fields),
            worker_ports=consecutive_ports(port + 1, workers),
            gpu_slots=gpu_slots,
        )
    )


def launcher_for(
    args: argparse.Namespace, settings: Settings, host: HostFacts
) -> SGLangServer | SGLangFleet:
    """`launcher` for the arguments of `sglang up`."""
    return launcher(
        settings,
        host,
        port=args.port,
        model=args.model,
        workers=args.workers,
        bind=args.host,
        router_policy=args.router_policy,
    )


def _up(args: argparse.Namespace) -> int:
    host = detect_host()
    try:
        running = launcher_for(args, Settings(), host)
        url = running.start(host)
    except (SGLangServerError, PlacementError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(url)
    return 0


def _setup(args: argparse.Namespace) -> int:
    settings = Settings()
    host = detect_host()
    asked = settings.placed("sglang").device
    on_gpu = asked.startswith("cuda") or (asked == "auto" and bool(host.gpus))
    device: Literal["cpu", "cuda"] = "cuda" if on_gpu else "cpu"
    try:
        python = ensure_sglang_env(settings.cache_dir, device)
        ensure_sglang_router(settings.cache_dir, device)
        model_dir = ensure_smollm2_model(settings.cache_dir, device)
    except SGLangServerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"SGLang environment ({device}): {python}\nSmolLM2-135M-Instruct: {model_dir}")
    return 0


def _down(args: argparse.Namespace) -> int:
    cache_dir = Settings().cache_dir
    fleet = SGLangFleet.find(cache_dir, args.port)
    if fleet is not None:
        stopped = fleet.stop()
    else:
        stopped = SGLangServer(SGLangServerConfig(port=args.port, cache_dir=cache_dir)).stop()
    print("stopped" if stopped else "not running")
    return 0


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def add_sglang_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sglang = commands.add_parser("sglang", help="a local SGLang server").add_subparsers(
        dest="sglang_command", required=True
    )
    up = sglang.add_parser("up", help="build its environment if needed, start it, wait")
    up.add_argument("--host", default="127.0.0.1", help="the address it listens on")
    up.add_argument("--port", type=int, default=DEFAULT_SGLANG_PORT)
    up.add_argument(
        "--model",
        "--model-dir",
        dest="model",
        default=None,
        help="a hub id or a model folder (default: SmolLM2-135M-Instruct, converted locally)",
    )
    up.add_argument(
        "--workers",
        type=_positive_int,
        default=1,
        help="N>1: N workers on the ports after --port (one GPU each on a GPU machine) and "
        "sglang-router on --port",
    )
    up.add_argument(
        "--router-policy", choices=["cache_aware", "round_robin"], default="cache_aware"
    )
    up.set_defaults(run=_up)
    setup = sglang.add_parser(
        "setup", help="build its environment, router and model, start nothing"
    )
    setup.set_defaults(run=_setup)
    down = sglang.add_parser("down", help="stop it (or the router and its workers)")
    down.add_argument("--port", type=int, default=DEFAULT_SGLANG_PORT)
    down.set_defaults(run=_down)
