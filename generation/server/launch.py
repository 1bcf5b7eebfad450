"""Run a real SGLang server as a child process group, found again through a pid file.

Its argv and environment are a pure function of `SGLangServerConfig` and the host's facts
(`launch_plan`, with `host.HostFacts`):

On a GPU
    Stock SGLang from a venv of its own with SGLang's own dependencies (``env.py``), the flags
    ``docker/compose.yaml`` gives its workers (tests/unit/test_docker_compose.py holds the two
    together), SGLang's own sizing of its KV cache, and ``--mem-fraction-static`` only where
    something else is to share the GPU (``answer_service/runtime/placement.py``). The GPU is
    chosen with ``CUDA_VISIBLE_DEVICES``, as compose's device reservation does.
On the CPU
    Two stand-in modules (``sgl_kernel`` and ``torchvision``) and the CPU prefix-attention patch
    on the server's ``PYTHONPATH`` only (``generation/server/sglang_compat/README.md``), the
    CPU flags, and ``--max-total-tokens`` sized for these machines.
Either
    The model is a hub id or a folder; the hub is forced offline only where none answers.

Its environment and model come from `generation.server.env`. Every failure raises
`SGLangServerError` with the cause chained.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from generation.errors import SGLangServerError
from generation.server.env import (
    ensure_sglang_env,
    ensure_smollm2_model,
    offline_env,
    write_tiny_model,
)
from generation.server.host import HostFacts, cpu_has_native_bf16, detect_host
from generation.server.process_group import PidFileProcess, http_ok, port_in_use

logger = logging.getLogger(__name__)

COMPAT_DIR = Path(__file__).resolve().parent / "sglang_compat"
# Read by sglang_compat/cpu_prefix_attention in the server process; "0" turns that patch off.
CPU_PREFIX_ATTENTION_ENV = "ANSWER_SGLANG_CPU_PREFIX_ATTENTION"
# The KV cache's size on the CPU, where SGLang would otherwise size it from the host's memory.
CPU_MAX_TOTAL_TOKENS = 16384

Device = Literal["cpu", "cuda"]

__all__ = [
    "COMPAT_DIR",
    "CPU_PREFIX_ATTENTION_ENV",
    "LaunchPlan",
    "SGLangServer",
    "SGLangServerConfig",
    "SGLangServerError",
    "cpu_has_native_bf16",
    "ensure_sglang_env",
    "ensure_smollm2_model",
    "write_tiny_model",
]


@dataclass(frozen=True, slots=True)
class SGLangServerConfig:
    host: str = "127.0.0.1"
    port: int = 30000
    cache_dir: Path = field(default_factory=lambda: Path.home() / ".cache" / "answer-service")
    # A hub id or a folder; wins over `model_dir`. Neither: SmolLM2-135M, converted locally.
    model: str | None = None
    model_dir: Path | None = None
    load_format: Literal["auto", "dummy"] = "auto"
    # None: CPU_MAX_TOTAL_TOKENS on the CPU; on a GPU, SGLang sizes it from the memory it has.
    max_total_tokens: int | None = None
    context_length: int | None = None
    startup_timeout_s: float = 300.0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # GPU only: the one GPU it sees (nvidia-smi's index, as CUDA_VISIBLE_DEVICES); None: all.
    gpu_id: int | None = None
    # GPU only: SGLang's share of its GPU for weights and KV cache; None: SGLang's own choice,
    # right when nothing else uses that GPU (answer_service/runtime/placement.py decides).
    mem_fraction_static: float | None = None
    extra_args: tuple[str, ...] = ()
    log_path: Path | None = None
    # CPU only: attend only new query rows to cached keys in prefill (sglang_compat/README.md).
    # False forces it off; True leaves the server's environment to decide (on unless "0").
    cpu_prefix_attention: bool = True
    # Torch's intra-op threads on the CPU (OMP_NUM_THREADS); None: one per core. Workers that
    # share the cores get fewer each (SGLang's own thread binding needs AMX, absent here).
    cpu_threads: int | None = None
    # The CPU server's dtype; auto: bfloat16 where the CPU computes it natively (AVX-512 BF16 or
    # AMX), else float32: without those, torch's bf16 matmuls run ~100x slower than fp32 (a
    # 1,000-token prefill of SmolLM2 went from ~0.6 s to 15 s on an AVX2-only EPYC).
    cpu_dtype: Literal["auto", "bfloat16", "float32"] = "auto"


@dataclass(frozen=True, slots=True)
class LaunchPlan:
    device: Device
    argv: tuple[str, ...]
    env: Mapping[str, str]


# --------------------------------------------------------------------------- server


class SGLangServer:
    """One SGLang server process group, found again across processes through a pid file."""

    def __init__(self, config: SGLangServerConfig) -> None:
        self._config = config
        self._process = PidFileProcess("sglang", self.pid_path, self.log_path, b"sglang")

    @property
    def config(self) -> SGLangServerConfig:
        return self._config

    @property
    def url(self) -> str:
        return f"http://{self._config.host}:{self._config.port}"

    @property
    def pid_path(self) -> Path:
        return self._config.cache_dir / "run" / f"sglang-{self._config.port}.pid"

    @property
    def log_path(self) -> Path:
        default = self._config.cache_dir / "logs" / f"sglang-{self._config.port}.log"
        return self._config.log_path or default

    def resolved_device(self, host: HostFacts) -> Device:
        """cuda where asked, or on auto where a GPU is seen; refuses a GPU that is not there."""
        cfg = self._config
        device: Device = cfg.device if cfg.device != "auto" else ("cuda" if host.gpus else "cpu")
        if device == "cuda":
            if not host.gpus:
                raise SGLangServerError("sglang asked to run on a GPU, but nvidia-smi lists none")
            if cfg.gpu_id is not None and host.gpu(cfg.gpu_id) is None:
                seen = ", ".join(str(gpu.index) for gpu in host.gpus)
                raise SGLangServerError(f"no GPU {cfg.gpu_id} here (nvidia-smi lists {seen})")
        return device

    def resolved_cpu_dtype(self, host: HostFacts) -> Literal["bfloat16", "float32"]:
        if self._config.cpu_dtype != "auto":
            return self._config.cpu_dtype
        return "bfloat16" if host.cpu_native_bf16 else "float32"

    def launch_plan(
        self, python: Path, model: str | Path, host: HostFacts, base_env: Mapping[str, str]
    ) -> LaunchPlan:
        """What `start` runs on a machine with these facts; pure."""
        device = self.resolved_device(host)
        argv = self.command(python, model, device, self.resolved_cpu_dtype(host))
        env = self.environment(base_env, device, hub_reachable=host.hub_reachable)
        return LaunchPlan(device, tuple(argv), env)

    def command(
        self,
        python: Path,
        model: str | Path,
        device: Device = "cpu",
        cpu_dtype: Literal["bfloat16", "float32"] = "bfloat16",
    ) -> list[str]:
        """The server's argv; pure. On a GPU, with nothing set beyond host and port, it is the
        argv of compose's workers (the order included)."""
        cfg = self._config
        argv = [
            str(python),
            "-m",
            "sglang.launch_server",
            "--model-path",
            str(model),
            "--host",
            cfg.host,
            "--port",
            str(cfg.port),
        ]
        if cfg.load_format != "auto":
            argv += ["--load-format", cfg.load_format]
        max_total_tokens = cfg.max_total_tokens
        if device == "cpu" and max_total_tokens is None:
            max_total_tokens = CPU_MAX_TOTAL_TOKENS
        if max_total_tokens is not None:
            argv += ["--max-total-tokens", str(max_total_tokens)]
        # cached_tokens in every response: the service's cache estimate and `done` need it.
        argv += ["--enable-cache-report", "--enable-metrics"]
        if cfg.context_length is not None:
            argv += ["--context-length", str(cfg.context_length)]
        if device == "cpu":
            argv += [
                "--device",
                "cpu",
                "--attention-backend",
                "torch_native",  # the x86 default needs AMX
                "--disable-overlap-schedule",
                "--dtype",
                cpu_dtype,
                "--grammar-backend",
                "none",
                "--sleep-on-idle",  # else the idle scheduler spins a whole core
            ]
        elif cfg.mem_fraction_static is not None:
            argv += ["--mem-fraction-static", f"{cfg.mem_fraction_static:g}"]
        return argv + list(cfg.extra_args)

    def environment(
        self, base: Mapping[str, str], device: Device = "cpu", *, hub_reachable: bool = False
    ) -> dict[str, str]:
        """The server's environment; pure. The CPU adds the compat modules and CPU engine; a GPU
        gets only its GPU; offline unless a hub answers."""
        env = dict(base) if hub_reachable else offline_env(base)
        if device == "cuda":
            if self._config.gpu_id is not None:
                env["CUDA_VISIBLE_DEVICES"] = str(self._config.gpu_id)
            return env
        env["SGLANG_USE_CPU_ENGINE"] = "1"
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        # /health answers without running a 1-token generation: sglang-router checks its
        # workers' /health every few seconds, and on two cores each check would take
        # prefill time and be counted in the worker's token metrics as traffic.
        # /health_generate still generates (`_serves` uses it).
        env.setdefault("SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", "0")
        if self._config.cpu_threads is not None:
            env["OMP_NUM_THREADS"] = str(self._config.cpu_threads)
        parts = [str(COMPAT_DIR), *filter(None, [base.get("PYTHONPATH", "")])]
        env["PYTHONPATH"] = os.pathsep.join(parts)
        if not self._config.cpu_prefix_attention:
            env[CPU_PREFIX_ATTENTION_ENV] = "0"
        return env

    def is_healthy(self, timeout_s: float = 2.0) -> bool:
        return http_ok(f"{self.url}/health", timeout_s)

    def start(self, host: HostFacts | None = None) -> str:
        """Ensure env and model, spawn the server and wait until it serves; return its url.
        `host`: this machine's facts (detected when not given)."""
        pid = self._process.running_pid()
        if pid is not None:
            if self.is_healthy():
                logger.info("sglang already running url=%s pid=%d", self.url, pid)
                return self.url
            raise SGLangServerError(
                f"sglang pid {pid} from {self.pid_path} is running but not healthy "
                f"(still starting, or stuck); stop() it first. Log {self.log_path}"
            )
        self.pid_path.unlink(missing_ok=True)
        if port_in_use(self._config.host, self._config.port):
            raise SGLangServerError(
                f"port {self._config.port} is in use by a process this service did not start"
            )
        host = host or detect_host()
        device = self.resolved_device(host)
        python = ensure_sglang_env(self._config.cache_dir, device)
        model = self.model_or_default(device)
        plan = self.launch_plan(python, model, host, os.environ)
        logger.info(
            "sglang starting url=%s device=%s gpu=%s mem_fraction_static=%s model=%s log=%s",
            self.url,
            plan.device,
            self._config.gpu_id if plan.device == "cuda" else "-",
            self._config.mem_fraction_static if plan.device == "cuda" else "-",
            model,
            self.log_path,
        )
        self._process.spawn(list(plan.argv), dict(plan.env))
        startup_s = self._process.wait_ready(self._serves, self._config.startup_timeout_s)
        logger.info("sglang ready url=%s startup_s=%.1f", self.url, startup_s)
        return self.url

    def model_or_default(self, device: Device) -> str | Path:
        """The configured model, else SmolLM2-135M (converted once, in the venv for `device`)."""
        cfg = self._config
        return cfg.model or cfg.model_dir or ensure_smollm2_model(cfg.cache_dir, device)

    def _serves(self, remaining_s: float) -> bool:
        # /health answers before the model can generate; /health_generate proves it can.
        return self.is_healthy(timeout_s=2.0) and http_ok(
            f"{self.url}/health_generate", remaining_s
        )

    def stop(self, timeout_s: float = 15.0) -> bool:
        """SIGTERM the process group, SIGKILL after timeout_s; True if something was stopped."""
        return self._process.stop(timeout_s)
