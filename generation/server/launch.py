"""Run a real SGLang server as a child process group, found again through a pid file.

On a CPU-only machine the server needs two stand-in modules (``sgl_kernel`` and
``torchvision``, see ``generation/server/sglang_compat/README.md``) on the server's ``PYTHONPATH``
only, and the CPU flags of :meth:`SGLangServer.command`. Its environment and model come from
`generation.server.env`. Every failure raises `SGLangServerError` with the cause chained.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
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
from generation.server.process_group import PidFileProcess, http_ok, port_in_use

logger = logging.getLogger(__name__)

COMPAT_DIR = Path(__file__).resolve().parent / "sglang_compat"
# Read by sglang_compat/cpu_prefix_attention in the server process; "0" turns that patch off.
CPU_PREFIX_ATTENTION_ENV = "ANSWER_SGLANG_CPU_PREFIX_ATTENTION"

__all__ = [
    "COMPAT_DIR",
    "CPU_PREFIX_ATTENTION_ENV",
    "SGLangServer",
    "SGLangServerConfig",
    "SGLangServerError",
    "ensure_sglang_env",
    "ensure_smollm2_model",
    "write_tiny_model",
]


@dataclass(frozen=True, slots=True)
class SGLangServerConfig:
    host: str = "127.0.0.1"
    port: int = 30000
    cache_dir: Path = field(default_factory=lambda: Path.home() / ".cache" / "answer-service")
    model_dir: Path | None = None
    load_format: Literal["auto", "dummy"] = "auto"
    max_total_tokens: int = 16384
    context_length: int | None = None
    startup_timeout_s: float = 300.0
    device: Literal["auto", "cpu", "cuda"] = "auto"
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


def cpu_has_native_bf16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether this CPU multiplies bf16 natively (the embedder's twin is in retrieval/)."""
    try:
        flags = cpuinfo.read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def _gpu_present() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        done = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0 and "GPU" in done.stdout


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

    def resolved_device(self) -> Literal["cpu", "cuda"]:
        if self._config.device != "auto":
            return self._config.device
        return "cuda" if _gpu_present() else "cpu"

    def resolved_cpu_dtype(self) -> Literal["bfloat16", "float32"]:
        if self._config.cpu_dtype != "auto":
            return self._config.cpu_dtype
        return "bfloat16" if cpu_has_native_bf16() else "float32"

    def command(
        self,
        python: Path,
        model_dir: Path,
        device: Literal["cpu", "cuda"] = "cpu",
        cpu_dtype: Literal["bfloat16", "float32"] = "bfloat16",
    ) -> list[str]:
        """The server's argv; pure."""
        cfg = self._config
        argv = [
            str(python),
            "-m",
            "sglang.launch_server",
            "--model-path",
            str(model_dir),
            "--host",
            cfg.host,
            "--port",
            str(cfg.port),
            "--load-format",
            cfg.load_format,
            "--max-total-tokens",
            str(cfg.max_total_tokens),
            "--enable-cache-report",
            "--enable-metrics",
        ]
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
        return argv + list(cfg.extra_args)

    def environment(
        self, base: Mapping[str, str], device: Literal["cpu", "cuda"] = "cpu"
    ) -> dict[str, str]:
        """The server's environment; pure. CPU adds the compat modules and CPU engine."""
        env = offline_env(base)
        if device == "cpu":
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

    def start(self) -> str:
        """Ensure env and model, spawn the server and wait until it serves; return its url."""
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
        python = ensure_sglang_env(self._config.cache_dir)
        model_dir = self._config.model_dir or ensure_smollm2_model(self._config.cache_dir)
        device = self.resolved_device()
        logger.info("sglang starting url=%s log=%s", self.url, self.log_path)
        self._process.spawn(
            self.command(python, model_dir, device, self.resolved_cpu_dtype()),
            self.environment(os.environ, device),
        )
        startup_s = self._process.wait_ready(self._serves, self._config.startup_timeout_s)
        logger.info("sglang ready url=%s startup_s=%.1f", self.url, startup_s)
        return self.url

    def _serves(self, remaining_s: float) -> bool:
        # /health answers before the model can generate; /health_generate proves it can.
        return self.is_healthy(timeout_s=2.0) and http_ok(
            f"{self.url}/health_generate", remaining_s
        )

    def stop(self, timeout_s: float = 15.0) -> bool:
        """SIGTERM the process group, SIGKILL after timeout_s; True if something was stopped."""
        return self._process.stop(timeout_s)
