"""What an SGLang launch depends on beyond its config, detected once and passed in.

`HostFacts` holds the GPUs (as ``nvidia-smi`` lists them), whether the CPU multiplies bf16
natively, and whether a model hub answers. `SGLangServer.launch_plan` is a pure function of its
config and these facts, so the CPU and GPU launch lines are tested on any machine by passing the
facts of another (`detect_host` is the only part that looks at this one).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

DEFAULT_HUB = "https://huggingface.co"
_TRUE = {"1", "true", "yes", "on"}


@dataclass(frozen=True, slots=True)
class Gpu:
    index: int  # nvidia-smi's (physical) index, as CUDA_VISIBLE_DEVICES takes it
    name: str
    memory_mib: int


@dataclass(frozen=True, slots=True)
class HostFacts:
    gpus: tuple[Gpu, ...] = ()
    cpu_native_bf16: bool = False
    # A model hub answered (HF_ENDPOINT, else huggingface.co); where none does, SGLang and
    # transformers are told to stay offline and read the local cache.
    hub_reachable: bool = False

    def gpu(self, index: int) -> Gpu | None:
        return next((gpu for gpu in self.gpus if gpu.index == index), None)


def cpu_has_native_bf16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether this CPU multiplies bf16 natively (the embedder's twin is in retrieval/)."""
    try:
        flags = cpuinfo.read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def parse_gpu_list(text: str) -> tuple[Gpu, ...]:
    """``nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader,nounits``."""
    gpus = []
    for line in text.splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) != 3 or not parts[0].isdigit():
            continue
        try:
            gpus.append(Gpu(int(parts[0]), parts[1], int(float(parts[2]))))
        except ValueError:
            continue
    return tuple(gpus)


def list_gpus(timeout_s: float = 10.0) -> tuple[Gpu, ...]:
    if shutil.which("nvidia-smi") is None:
        return ()
    argv = ["nvidia-smi", "--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    return parse_gpu_list(done.stdout) if done.returncode == 0 else ()


def hub_reachable(env: Mapping[str, str], timeout_s: float = 3.0) -> bool:
    """Whether the hub the environment names answers its front page (an error status counts
    as no: a proxy that refuses the hub answers 403); False without asking where the
    environment already says offline."""
    if env.get("HF_HUB_OFFLINE", "").lower() in _TRUE:
        return False
    endpoint = env.get("HF_ENDPOINT") or DEFAULT_HUB
    request = urllib.request.Request(endpoint, method="HEAD")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s):
            return True  # urlopen raises HTTPError for 4xx and 5xx
    except (urllib.error.URLError, OSError, ValueError):
        return False


def detect_host(env: Mapping[str, str] | None = None, hub_timeout_s: float = 3.0) -> HostFacts:
    env = os.environ if env is None else env
    facts = HostFacts(
        gpus=list_gpus(),
        cpu_native_bf16=cpu_has_native_bf16(),
        hub_reachable=hub_reachable(env, hub_timeout_s),
    )
    logger.info(
        "host gpus=%s cpu_native_bf16=%s hub_reachable=%s",
        ",".join(f"{gpu.index}:{gpu.name}:{gpu.memory_mib}MiB" for gpu in facts.gpus) or "none",
        facts.cpu_native_bf16,
        facts.hub_reachable,
    )
    return facts
