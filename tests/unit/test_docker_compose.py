"""docker/: the compose file, its configs and the Dockerfiles agree with the code they run.

No Docker engine runs on the development machines, so this checks what holds without one: the
service's commands parse with this repository's own CLI parser; SGLang's and the router's use
only flags that this repository's tested command builders pass (plus two read off the router's
``--help``); `answer-service sglang up` on a GPU machine launches the same worker line, GPU for
GPU, and the same router (tracing aside); every variable the service gets is a `Settings` field
and validates as one; every reference between services, ports, volumes and collector components
resolves. Where a compose binary is installed, `docker compose config` checks the file against
the Compose schema too.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

import pytest
import yaml  # type: ignore[import-untyped]

from answer_service.cli.main import build_parser
from answer_service.cli.sglang import launcher_for
from answer_service.http.api import router as api_router
from answer_service.runtime.settings import Settings
from generation.server.env import SGLANG_ROUTER_PACKAGE
from generation.server.fleet import SGLangFleet
from generation.server.host import Gpu, HostFacts
from generation.server.launch import SGLangServer
from generation.server.router import SGLangRouter, SGLangRouterConfig

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"

STACK = {
    "lb",
    "answer-service",
    "indexer",
    "sgl-router",
    "sglang-0",
    "sglang-1",
    "redis",
    "otel-collector",
    "jaeger",
}
# In sglang-router 0.3.2's `python -m sglang_router.launch_router --help`, beyond the flags
# that generation/server/router.py passes.
ROUTER_EXTRA_FLAGS = frozenset({"--enable-trace", "--otlp-traces-endpoint"})
# Variables the service's own code does not read, for the libraries under it.
LIBRARY_ENV = frozenset({"HF_HUB_CACHE", "HF_HUB_OFFLINE"})
# Collector component types the compose's image (collector-contrib 0.144+) knows.
COLLECTOR_TYPES = {
    "receivers": {"otlp"},
    "processors": {"batch", "memory_limiter"},
    "exporters": {"otlp_grpc", "otlp_http", "debug"},
    "extensions": {"health_check"},
}


def _yaml(path: Path) -> dict[str, Any]:
    return cast(dict[str, Any], yaml.safe_load(path.read_text()))


COMPOSE = _yaml(DOCKER / "compose.yaml")
SERVICES = cast(dict[str, dict[str, Any]], COMPOSE["services"])
COLLECTOR = _yaml(DOCKER / "otel-collector.yaml")


def _defaults(value: str) -> str:
    """Compose interpolation with nothing set: `${VAR:-default}` becomes `default`."""
    return re.sub(r"\$\{[A-Za-z_][A-Za-z0-9_]*(?::?-([^}]*))?\}", lambda m: m.group(1) or "", value)


def _options(argv: list[str]) -> dict[str, list[str]]:
    """``--flag v1 v2 --switch`` as ``{"--flag": ["v1", "v2"], "--switch": []}``."""
    options: dict[str, list[str]] = {}
    current: list[str] = []
    for arg in argv:
        if arg.startswith("--"):
            name, _, inline = arg.partition("=")
            current = options.setdefault(name, [])
            if inline:
                current.append(inline)
        else:
            current.append(arg)
    return options


def _host_port(url: str) -> tuple[str | None, int | None]:
    parts = urlsplit(url if "://" in url else f"tcp://{url}")
    return parts.hostname, parts.port


def _command(service: str) -> list[str]:
    return [_defaults(str(arg)) for arg in SERVICES[service]["command"]]


def _environment(service: str) -> dict[str, str]:
    env = cast(dict[str, Any], SERVICES[service].get("environment", {}))
    return {name: _defaults(str(value)) for name, value in env.items()}


def _healthcheck_url(test: list[str]) -> tuple[int, str]:
    match = re.search(r"http://127\.0\.0\.1:(\d+)(/[\w/]*)", " ".join(test))
    assert match, f"no local URL in healthcheck {test}"
    return int(match.group(1)), match.group(2)


def _parse_cli(argv: list[str]) -> argparse.Namespace:
    try:
        return build_parser().parse_args(argv)
    except SystemExit:
        pytest.fail(f"answer-service rejects {argv}")


def _routes() -> set[str]:
    return {str(getattr(route, "path", "")) for route in api_router.routes}


# --------------------------------------------------------------------------- Dockerfile


def _instructions(path: Path) -> Iterator[tuple[str, str]]:
    """(INSTRUCTION, rest) per instruction, continuation lines joined, comments dropped."""
    pending = ""
    for line in path.read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.lstrip().startswith("#"):
            continue
        pending += line.rstrip().removesuffix("\\") + " "
        if not line.rstrip().endswith("\\"):
            keyword, _, rest = pending.strip().partition(" ")
            yield keyword.upper(), rest.strip()
            pending = ""


def _final_stage(path: Path) -> list[tuple[str, str]]:
    instructions = list(_instructions(path))
    last_from = max(i for i, (keyword, _) in enumerate(instructions) if keyword == "FROM")
    return instructions[last_from + 1 :]


def _exec_form(rest: str) -> list[str]:
    return cast(list[str], json.loads(rest))


def _args(path: Path) -> dict[str, str]:
    found = {}
    for keyword, rest in _instructions(path):
        if keyword == "ARG" and "=" in rest:
            name, _, value = rest.partition("=")
            found[name] = value.strip('"')
    return found


SERVICE_DOCKERFILE = DOCKER / "Dockerfile"
FINAL = dict(_final_stage(SERVICE_DOCKERFILE))  # the last of each instruction counts


def test_compose_names_the_whole_stack() -> None:
    assert set(SERVICES) == STACK


def test_dependencies_and_volumes_resolve() -> None:
    volumes = set(COMPOSE["volumes"])
    for name, service in SERVICES.items():
        for target, rule in service.get("depends_on", {}).items():
            assert target in SERVICES, f"{name} depends on unknown {target}"
            if rule["condition"] == "service_healthy":
                assert "healthcheck" in SERVICES[target], f"{target} has no healthcheck"
        for mount in service.get("volumes", []):
            source = str(mount).split(":")[0]
            if source.startswith("."):
                assert (DOCKER / source).is_file(), f"{name} mounts missing {source}"
            else:
                assert source in volumes, f"{name} mounts undeclared volume {source}"


def test_service_command_is_the_real_serve() -> None:
    argv = _command("answer-service")
    args = _parse_cli(argv)

    assert args.run.__name__ == "_serve"
    assert args.host == "0.0.0.0"
    assert args.port == int(FINAL["EXPOSE"])
    assert f"index:{args.index}:ro" in SERVICES["answer-service"]["volumes"]
    assert argv == _exec_form(FINAL["CMD"]), "compose and the image start it alike"
    check = SERVICES["answer-service"]["healthcheck"]["test"]
    assert _healthcheck_url(check) == (args.port, "/healthz")


def test_indexer_builds_the_bundled_corpus_into_the_volume() -> None:
    args = _parse_cli(_command("indexer"))

    assert args.run.__name__ == "_index_build"
    assert str(args.out) == _parse_cli(_command("answer-service")).index.as_posix()
    assert f"index:{args.out}" in SERVICES["indexer"]["volumes"]  # writable
    in_image: dict[str, str] = {}  # path in the image -> path in the repository
    for keyword, rest in _final_stage(SERVICE_DOCKERFILE):
        *sources, dest = rest.split()
        if keyword == "COPY" and not rest.startswith("--from") and dest.endswith("/"):
            in_image.update({f"{dest}{Path(source).name}": source for source in sources})
    (corpus,) = args.paths
    assert str(corpus) in in_image
    assert (ROOT / in_image[str(corpus)]).is_file()


def test_service_environment_is_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    names: set[str] = set()
    for field_name, field in Settings.model_fields.items():
        names.add(f"ANSWER_{field_name.upper()}")
        alias = field.validation_alias
        names.update(str(c) for c in getattr(alias, "choices", [alias] if alias else []))
    env = _environment("answer-service")
    assert set(env) - LIBRARY_ENV <= names, "not Settings fields"

    for name in list(os.environ):
        if name.startswith("ANSWER_") or name == "OTEL_EXPORTER_OTLP_ENDPOINT":
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = Settings()

    router_port = int(_options(_command("sgl-router"))["--port"][0])
    assert _host_port(settings.sglang_url) == ("sgl-router", router_port)
    assert settings.redis_url is not None
    assert _host_port(settings.redis_url) == ("redis", 6379)
    assert settings.otel_exporter_otlp_endpoint is not None
    http_receiver = COLLECTOR["receivers"]["otlp"]["protocols"]["http"]["endpoint"]
    assert _host_port(settings.otel_exporter_otlp_endpoint) == (
        "otel-collector",
        _host_port(http_receiver)[1],
    )
    # The hub cache SGLang fills, read-only.
    hf_home = SERVICES["sglang-0"]["environment"]["HF_HOME"]
    assert env["HF_HUB_CACHE"] == f"{hf_home}/hub"
    assert f"hf-cache:{hf_home}:ro" in SERVICES["answer-service"]["volumes"]


def _sglang_workers() -> list[str]:
    return sorted(name for name in SERVICES if name.startswith("sglang-"))


def test_router_uses_known_flags_and_routes_to_every_worker() -> None:
    argv = _command("sgl-router")
    assert argv[:3] == ["python", "-m", "sglang_router.launch_router"]
    options = _options(argv[3:])
    tested = SGLangRouter(SGLangRouterConfig(worker_urls=("http://w:1",))).command(Path("py"))
    known = {arg for arg in tested if arg.startswith("--")} | ROUTER_EXTRA_FLAGS
    assert set(options) <= known

    workers = {_host_port(url) for url in options["--worker-urls"]}
    expected = {(name, int(_options(_command(name))["--port"][0])) for name in _sglang_workers()}
    assert workers == expected
    assert set(_sglang_workers()) <= set(SERVICES["sgl-router"]["depends_on"])
    assert options["--policy"] == ["cache_aware"]
    assert options["--host"] == ["0.0.0.0"]
    port = int(options["--port"][0])
    assert _healthcheck_url(SERVICES["sgl-router"]["healthcheck"]["test"]) == (port, "/readiness")
    grpc_receiver = COLLECTOR["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"]
    assert _host_port(options["--otlp-traces-endpoint"][0]) == (
        "otel-collector",
        _host_port(grpc_receiver)[1],
    )


def test_router_image_is_the_tested_router_version() -> None:
    version = SGLANG_ROUTER_PACKAGE.split("==")[1]
    assert _args(DOCKER / "router.Dockerfile")["SGLANG_ROUTER_VERSION"] == version
    build = SERVICES["sgl-router"]["build"]
    assert (DOCKER / build["context"] / build["dockerfile"]).resolve() == (
        DOCKER / "router.Dockerfile"
    )
    assert SERVICES["sgl-router"]["image"].endswith(f":{version}")


def test_sglang_workers_run_the_official_image_each_on_its_own_gpu() -> None:
    workers = _sglang_workers()
    assert len(workers) >= 2
    gpus: list[str] = []
    for name in workers:
        service = SERVICES[name]
        assert _defaults(service["image"]).startswith("lmsysorg/sglang:")
        argv = _command(name)
        assert argv[:3] == ["python3", "-m", "sglang.launch_server"]
        options = _options(argv[3:])
        assert "--enable-cache-report" in options  # the service reads cached_tokens
        assert options["--host"] == ["0.0.0.0"]
        port = int(options["--port"][0])
        assert _healthcheck_url(service["healthcheck"]["test"]) == (port, "/health")
        (device,) = service["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia"
        assert device["capabilities"] == ["gpu"]
        gpus += [_defaults(gpu) for gpu in device["device_ids"]]
        assert f"hf-cache:{service['environment']['HF_HOME']}" in service["volumes"]
    assert len(set(gpus)) == len(gpus), "two workers on one GPU"


# A machine like compose's host: two GPUs, a model hub that answers.
GPU_HOST = HostFacts(
    gpus=(Gpu(0, "NVIDIA H200", 143_771), Gpu(1, "NVIDIA H200", 143_771)), hub_reachable=True
)


def _gpu_of(service: str) -> str:
    (device,) = SERVICES[service]["deploy"]["resources"]["reservations"]["devices"]
    (gpu,) = device["device_ids"]
    return _defaults(gpu)


def _sglang_up(settings: Settings, *flags: str) -> SGLangServer | SGLangFleet:
    """What `answer-service sglang up FLAGS` would start on GPU_HOST (nothing is started)."""
    return launcher_for(_parse_cli(["sglang", "up", *flags]), settings, GPU_HOST)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("ANSWER_"):
            monkeypatch.delenv(name)


@pytest.mark.usefixtures("clean_env")
def test_sglang_up_on_a_gpu_launches_the_compose_worker_line() -> None:
    compose = _command("sglang-0")
    model = _options(compose)["--model-path"][0]
    port = _options(compose)["--port"][0]
    flags = ("--host", "0.0.0.0", "--port", port, "--model", model)
    # As in compose, the service's own models are not on SGLang's GPU (its container has none).
    alone = _sglang_up(Settings(device="cpu"), *flags)
    assert isinstance(alone, SGLangServer)
    plan = alone.launch_plan(Path("python3"), model, GPU_HOST, {"HF_HOME": "/hf-cache"})

    assert plan.device == "cuda"
    assert list(plan.argv) == compose, "the same line, flag for flag and in order"
    assert plan.env == {"HF_HOME": "/hf-cache", "CUDA_VISIBLE_DEVICES": _gpu_of("sglang-0")}

    # By default the service's embedder, reranker and index share GPU 0: the one difference is
    # the share SGLang leaves them.
    shared = _sglang_up(Settings(), *flags)
    assert isinstance(shared, SGLangServer)
    shared_argv = shared.launch_plan(Path("python3"), model, GPU_HOST, {}).argv
    assert list(shared_argv) == [*compose, "--mem-fraction-static", "0.72"]


@pytest.mark.usefixtures("clean_env")
def test_sglang_up_with_workers_launches_the_compose_fleet() -> None:
    model = _options(_command("sglang-0"))["--model-path"][0]
    workers = _sglang_workers()
    router_port = _options(_command("sgl-router"))["--port"][0]
    fleet = _sglang_up(
        Settings(device="cpu"),
        *("--host", "0.0.0.0", "--port", router_port, "--model", model),
        *("--workers", str(len(workers))),
    )
    assert isinstance(fleet, SGLangFleet)

    for worker, name in zip(fleet.workers, workers, strict=True):
        plan = worker.launch_plan(Path("python3"), model, GPU_HOST, {})
        ours, theirs = _options(list(plan.argv)), _options(_command(name))
        # Compose's workers each have a container and its port to themselves; ours share a host.
        assert ours.pop("--port") != theirs.pop("--port")
        assert list(plan.argv[:3]) == _command(name)[:3]
        assert ours == theirs, name
        assert plan.env["CUDA_VISIBLE_DEVICES"] == _gpu_of(name)

    compose = _command("sgl-router")
    ours_router = fleet.router.command(Path(compose[0]))
    assert ours_router[:3] == compose[:3]
    ours, theirs = _options(ours_router[3:]), _options(compose[3:])
    assert len(ours.pop("--worker-urls")) == len(theirs.pop("--worker-urls"))
    for flag in ROUTER_EXTRA_FLAGS:  # tracing: compose has a collector to send it to
        theirs.pop(flag)
    assert ours == theirs


def test_collector_pipelines_use_defined_components() -> None:
    for kind, types in COLLECTOR_TYPES.items():
        for component in COLLECTOR.get(kind, {}):
            assert component.split("/")[0] in types, f"unknown {kind} type {component}"
    service = COLLECTOR["service"]
    assert set(service.get("extensions", [])) <= set(COLLECTOR["extensions"])
    assert service["pipelines"]
    for pipeline in service["pipelines"].values():
        for kind in ("receivers", "processors", "exporters"):
            assert set(pipeline.get(kind, [])) <= set(COLLECTOR.get(kind, {})), kind

    (exporter,) = (e for name, e in COLLECTOR["exporters"].items() if name.startswith("otlp"))
    host, port = _host_port(exporter["endpoint"])
    assert host == "jaeger"
    assert (
        f"receivers.otlp.protocols.grpc.endpoint=0.0.0.0:{port}"
        in _options(_command("jaeger"))["--set"]
    )

    (config,) = _options(_command("otel-collector"))["--config"]
    assert f"./otel-collector.yaml:{config}:ro" in SERVICES["otel-collector"]["volumes"]


def test_dockerfile_runs_the_real_cli() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (script,) = _exec_form(FINAL["ENTRYPOINT"])
    assert pyproject["project"]["scripts"][script] == "answer_service.cli.main:main"
    args = _parse_cli(_exec_form(FINAL["CMD"]))
    assert args.run.__name__ == "_serve"

    healthcheck = FINAL["HEALTHCHECK"]
    assert _healthcheck_url([healthcheck]) == (args.port, "/healthz")
    assert "/healthz" in _routes()

    torch_pin = next(d for d in pyproject["project"]["dependencies"] if d.startswith("torch=="))
    assert f"torch=={_args(SERVICE_DOCKERFILE)['TORCH_VERSION']}" == torch_pin


def test_dockerfile_copies_the_package_and_its_ignore_file_lets_it() -> None:
    copied = [
        rest.split()[:-1]
        for keyword, rest in _instructions(SERVICE_DOCKERFILE)
        if keyword == "COPY" and not rest.startswith("--from")
    ]
    sources = [source for sources in copied for source in sources]
    for source in sources:
        assert (ROOT / source).exists(), source
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    for package in packages["packages"]["find"]["include"]:
        assert package.rstrip("*") in sources

    ignore = (DOCKER / "Dockerfile.dockerignore").read_text().splitlines()
    assert "*" in ignore
    for source in sources:
        assert f"!{source.split('/')[0]}" in ignore, f"{source} is left out of the context"
    build = SERVICES["answer-service"]["build"]
    assert (DOCKER / build["context"]).resolve() == ROOT
    assert (ROOT / build["dockerfile"]).resolve() == SERVICE_DOCKERFILE


def test_load_balancer_spreads_over_the_replicas() -> None:
    config = (DOCKER / "haproxy.cfg").read_text()
    serve_port = _parse_cli(_command("answer-service")).port
    template = re.search(r"^\s*server-template \S+ \d+-\d+ ([\w-]+):(\d+)", config, re.M)
    assert template
    assert (template.group(1), int(template.group(2))) == ("answer-service", serve_port)
    check = re.search(r"^\s*option httpchk GET (\S+)", config, re.M)
    assert check
    assert check.group(1) in _routes()
    bind = re.search(r"^\s*bind :(\d+)", config, re.M)
    assert bind
    assert _defaults(SERVICES["lb"]["ports"][0]).endswith(f":{bind.group(1)}")
    assert "./haproxy.cfg:/usr/local/etc/haproxy/haproxy.cfg:ro" in SERVICES["lb"]["volumes"]

    replicas = SERVICES["answer-service"]
    assert int(_defaults(str(replicas["deploy"]["replicas"]))) >= 2
    assert "ports" not in replicas, "replicas cannot share a published port"
    assert "container_name" not in replicas


def _compose_binary() -> list[str] | None:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if shutil.which("docker"):
        probe = subprocess.run(
            ["docker", "compose", "version"], capture_output=True, timeout=30, check=False
        )
        if probe.returncode == 0:
            return ["docker", "compose"]
    return None


def test_compose_config_validates_where_compose_is_installed() -> None:
    binary = _compose_binary()
    if binary is None:
        pytest.skip("no docker compose here")
    done = subprocess.run(
        [*binary, "-f", str(DOCKER / "compose.yaml"), "--profile", "tools", "config", "--quiet"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
