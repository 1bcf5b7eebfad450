"""Run a real SGLang server as a child process group, found again through a pid file.

On a CPU-only machine the server needs two stand-in modules (``sgl_kernel`` and
``torchvision``, see ``generation/sglang_compat/README.md``) on the server's ``PYTHONPATH``
only, and the CPU flags of :meth:`SGLangServer.command`. Its environment and model come from
`generation.sglang_env`. Every failure raises `SGLangServerError` with the cause chained.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from generation.errors import SGLangServerError
from generation.sglang_env import (
    ensure_sglang_env,
    ensure_smollm2_model,
    offline_env,
    write_tiny_model,
)

logger = logging.getLogger(__name__)

COMPAT_DIR = Path(__file__).resolve().parent / "sglang_compat"

__all__ = [
    "COMPAT_DIR",
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


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


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
        self._process: subprocess.Popen[bytes] | None = None

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

    def command(
        self, python: Path, model_dir: Path, device: Literal["cpu", "cuda"] = "cpu"
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
                "bfloat16",
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
            parts = [str(COMPAT_DIR), *filter(None, [base.get("PYTHONPATH", "")])]
            env["PYTHONPATH"] = os.pathsep.join(parts)
        return env

    def is_healthy(self, timeout_s: float = 2.0) -> bool:
        return _http_ok(f"{self.url}/health", timeout_s)

    def start(self) -> str:
        """Ensure env and model, spawn the server and wait until it serves; return its url."""
        pid = self._running_pid()
        if pid is not None:
            if self.is_healthy():
                logger.info("sglang already running url=%s pid=%d", self.url, pid)
                return self.url
            raise SGLangServerError(
                f"sglang pid {pid} from {self.pid_path} is running but not healthy "
                f"(still starting, or stuck); stop() it first. Log {self.log_path}"
            )
        self.pid_path.unlink(missing_ok=True)
        if _port_in_use(self._config.host, self._config.port):
            raise SGLangServerError(
                f"port {self._config.port} is in use by a process this service did not start"
            )
        python = ensure_sglang_env(self._config.cache_dir)
        model_dir = self._config.model_dir or ensure_smollm2_model(self._config.cache_dir)
        device = self.resolved_device()
        self._spawn(self.command(python, model_dir, device), self.environment(os.environ, device))
        self._wait_until_ready()
        return self.url

    def _spawn(self, argv: list[str], env: dict[str, str]) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.pid_path.parent.mkdir(parents=True, exist_ok=True)
        logger.info("sglang starting url=%s log=%s", self.url, self.log_path)
        try:
            with self.log_path.open("wb") as log:
                self._process = subprocess.Popen(
                    argv,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    start_new_session=True,
                )
        except OSError as exc:
            raise SGLangServerError(f"could not start sglang: {exc}") from exc
        self.pid_path.write_text(f"{self._process.pid}\n")

    def _wait_until_ready(self) -> None:
        started = time.monotonic()
        deadline = started + self._config.startup_timeout_s
        while time.monotonic() < deadline:
            self._raise_if_exited()
            if self.is_healthy(timeout_s=2.0):
                remaining_s = max(deadline - time.monotonic(), 5.0)
                if _http_ok(f"{self.url}/health_generate", remaining_s):
                    logger.info(
                        "sglang ready url=%s startup_s=%.1f", self.url, time.monotonic() - started
                    )
                    return
            time.sleep(0.5)
        self.stop()
        raise SGLangServerError(
            f"sglang did not become healthy within {self._config.startup_timeout_s:.0f} s; "
            f"log {self.log_path}:\n{_tail(self.log_path)}"
        )

    def _raise_if_exited(self) -> None:
        if self._process is None or self._process.poll() is None:
            return
        code = self._process.returncode
        self.stop()
        raise SGLangServerError(
            f"sglang exited early with code {code}; log {self.log_path}:\n{_tail(self.log_path)}"
        )

    def stop(self, timeout_s: float = 15.0) -> bool:
        """SIGTERM the process group, SIGKILL after timeout_s; True if something was stopped."""
        pid = self._running_pid()
        stopped = False
        if pid is not None:
            stopped = _signal_group(pid, signal.SIGTERM)
            if not self._wait_group_gone(pid, timeout_s):
                logger.warning("sglang ignored SIGTERM, killing pgid=%d", pid)
                _signal_group(pid, signal.SIGKILL)
                self._wait_group_gone(pid, 5.0)
        if self._process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(timeout=1.0)
            self._process = None
        self.pid_path.unlink(missing_ok=True)
        return stopped

    def _wait_group_gone(self, pgid: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process is not None:
                self._process.poll()  # reap our own child so it does not linger as a zombie
            if not _group_alive(pgid):
                return True
            time.sleep(0.1)
        return not _group_alive(pgid)

    def _running_pid(self) -> int | None:
        """The pid (= process group) from our pid file, if that group still runs SGLang."""
        try:
            pid = int(self.pid_path.read_text().strip())
        except (OSError, ValueError):
            return None
        if not _group_alive(pid) or not _looks_like_sglang(pid):
            return None
        return pid


def _http_ok(url: str, timeout_s: float) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        return sock.connect_ex((host, port)) == 0


def _signal_group(pgid: int, sig: signal.Signals) -> bool:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError as exc:
        raise SGLangServerError(f"cannot signal sglang process group {pgid}: {exc}") from exc
    return True


def _looks_like_sglang(pid: int) -> bool:
    """Guards against a recycled pid. A pid is not reused while its process group lives, so a
    gone or zombie leader (empty cmdline) with live members is still ours."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True
    return not cmdline or b"sglang" in cmdline


def _group_alive(pgid: int) -> bool:
    """Whether any live (non-zombie) process is in process group pgid."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        return True
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Fields after the parenthesised command: state ppid pgrp ...
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False
