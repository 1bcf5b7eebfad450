"""Which device each model runs on, and how much of a GPU each may take.

The service's embedder, reranker and index, and SGLang, would otherwise all land on GPU 0 and
each claim as much of it as it likes (SGLang alone takes ~93 % of an H200 for weights and KV
cache). Here each gets a device and a share (a fraction of that GPU's total memory: the unit
of SGLang's ``--mem-fraction-static``):

    the service's models   `plan_placement`: from the settings and the GPUs torch sees; the
                           service caps its torch allocator on each GPU at the sum of the
                           shares placed there (`apply_torch_memory_caps`), and an index whose
                           vectors exceed its share stays on the CPU (retrieval/index/placement.py)
    SGLang's workers       `plan_sglang_workers`: one GPU each, from the one `placement` gives `sglang` on; a worker
                           whose GPU also holds some of the service's models gets
                           ``1 - their shares - SGLANG_RESERVE_FRACTION`` (or sglang's placed share),
                           one alone on its GPU is left to SGLang, as in docker/compose.yaml

Both are pure functions of `Settings` and a GPU count, and `answer-service sglang up` computes
the service's side from the same settings, so the two agree on what shares a GPU as long as
they run with the same environment.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

from answer_service.runtime.settings import Settings

logger = logging.getLogger(__name__)

# SGLang 0.5.23 keeps at least 10 GiB of a GPU over 60 GiB out of its static pool, for
# activations and CUDA graphs (sglang/srt/arg_groups/memory_hook.py): 7-13 % of an 80-141 GiB
# GPU. Held back from SGLang's share when it shares its GPU; set sglang's share (`placement`) on
# smaller GPUs, whose reserve is a larger part of them.
SGLANG_RESERVE_FRACTION = 0.13
# Below this, SGLang on a shared GPU would hold little more than its weights: refuse instead.
MIN_SGLANG_FRACTION = 0.30


class PlacementError(ValueError):
    """The settings ask for a split of a GPU that cannot work."""


@dataclass(frozen=True, slots=True)
class DeviceSlot:
    device: str  # "cpu" or "cuda:N"
    gpu_memory_fraction: float = 0.0  # of that GPU's total memory; 0 on the CPU
    note: str = ""  # why it is not where it was asked to be

    @property
    def gpu(self) -> int | None:
        return int(self.device.removeprefix("cuda:")) if self.device.startswith("cuda:") else None


@dataclass(frozen=True, slots=True)
class Placement:
    embedder: DeviceSlot
    reranker: DeviceSlot
    index: DeviceSlot

    @property
    def slots(self) -> dict[str, DeviceSlot]:
        return {"embedder": self.embedder, "reranker": self.reranker, "index": self.index}

    def service_share(self, gpu: int) -> float:
        """The part of GPU `gpu` the service's models may take together."""
        return sum(s.gpu_memory_fraction for s in self.slots.values() if s.gpu == gpu)

    def torch_memory_caps(self) -> dict[int, float]:
        """GPU -> the fraction of it this process's torch allocator may hold."""
        gpus = {slot.gpu for slot in self.slots.values() if slot.gpu is not None}
        return {gpu: round(self.service_share(gpu), 6) for gpu in sorted(gpus)}

    def describe(self) -> str:
        """One key=value per model, for the start-up log."""
        parts = []
        for name, slot in self.slots.items():
            share = f"@{slot.gpu_memory_fraction:g}" if slot.gpu is not None else ""
            note = f"({slot.note})" if slot.note else ""
            parts.append(f"{name}={slot.device}{share}{note}")
        return " ".join(parts)


@dataclass(frozen=True, slots=True)
class SGLangWorkerSlot:
    gpu: int
    # None: SGLang's own choice (nothing of the service's on this GPU, and no setting).
    mem_fraction_static: float | None


def _resolve(name: str, asked: str, fraction: float, gpu_count: int) -> DeviceSlot:
    if asked == "cpu" or (asked == "auto" and gpu_count == 0):
        return DeviceSlot("cpu")
    gpu = 0 if asked in ("auto", "cuda") else int(asked.removeprefix("cuda:"))
    if gpu >= gpu_count:
        return DeviceSlot("cpu", note=f"{name} asked for {asked}, {gpu_count} GPU(s) seen")
    return DeviceSlot(f"cuda:{gpu}", fraction)


def plan_placement(settings: Settings, gpu_count: int) -> Placement:
    """Each of the service's models on its device, with its share there."""
    slots = {}
    for part in ("embedder", "reranker", "index"):
        asked = settings.placed(part)
        assert asked.gpu_share is not None
        slots[part] = _resolve(part, asked.device, asked.gpu_share, gpu_count)
    placement = Placement(**slots)
    for gpu, share in placement.torch_memory_caps().items():
        if share >= 1.0:
            raise PlacementError(f"the service's models ask for {share:g} of GPU {gpu}")
    return placement


def plan_sglang_workers(
    settings: Settings, placement: Placement, workers: int, gpu_count: int
) -> tuple[SGLangWorkerSlot, ...]:
    """One GPU per worker from sglang's placed GPU on, and each one's share; () on the CPU."""
    asked = settings.placed("sglang")
    if asked.device == "cpu" or (asked.device == "auto" and gpu_count == 0):
        return ()
    first = int(asked.device.partition(":")[2] or 0)
    if first + workers > gpu_count:
        raise PlacementError(
            f"{workers} SGLang worker(s) from GPU {first} need GPUs {first}-{first + workers - 1}; "
            f"{gpu_count} seen"
        )
    return tuple(
        SGLangWorkerSlot(gpu, _sglang_fraction(asked.gpu_share, placement.service_share(gpu), gpu))
        for gpu in range(first, first + workers)
    )


def _sglang_fraction(asked: float | None, shared: float, gpu: int) -> float | None:
    if asked is not None:
        if asked + shared >= 1.0:
            raise PlacementError(
                f"sglang's share {asked:g} and the service's {shared:g} of GPU "
                f"{gpu} add up to 1 or more"
            )
        return asked
    if shared == 0:
        return None
    # Down to a thousandth (float noise first rounded away, so 0.77 stays 0.77).
    fraction = math.floor(round((1.0 - shared - SGLANG_RESERVE_FRACTION) * 1000, 6)) / 1000
    if fraction < MIN_SGLANG_FRACTION:
        raise PlacementError(
            f"the service's models take {shared:g} of GPU {gpu}, leaving SGLang {fraction:g}: "
            "lower their shares, or put them or SGLang on another GPU"
        )
    return fraction


def cuda_gpu_count() -> int:
    """The GPUs this process's torch sees."""
    import torch

    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


def gpu_total_bytes(gpu: int) -> int:
    import torch

    return int(torch.cuda.get_device_properties(gpu).total_memory)


def apply_torch_memory_caps(
    placement: Placement, set_fraction: Callable[[float, int], None] | None = None
) -> dict[int, float]:
    """Cap this process's torch allocator on each GPU at the service's share of it; returns
    the caps. (faiss-gpu allocates outside torch: its share is kept by the index's placement.)"""
    caps = placement.torch_memory_caps()
    if caps and set_fraction is None:
        import torch

        set_fraction = torch.cuda.set_per_process_memory_fraction
    for gpu, fraction in caps.items():
        assert set_fraction is not None
        set_fraction(fraction, gpu)
    return caps
