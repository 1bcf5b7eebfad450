"""Where a loaded faiss index is searched: on the CPU, or on a GPU through faiss-gpu or torch.

    kind   asked for a GPU, and              searched by
    hnsw   (always)                          faiss on the CPU: faiss has no GPU HNSW
    flat   faiss-gpu sees the GPU            faiss-gpu, one search at a time
    flat   only torch sees it                `TorchExactSearch` there, one search at a time
    ivf    faiss-gpu sees the GPU            faiss-gpu, one search at a time
    ivf    only torch sees it                faiss on the CPU (torch does exact search only)
    any    its vectors exceed its GPU share  faiss on the CPU

Every search placed on a GPU is wrapped in `SerialSearch` (see its docstring for why). Where
the asked-for placement cannot be had, the index is searched on the CPU and `PlacedSearch.reason`
says why; the loader logs it. GPUs are reached through `GpuBackends`, so tests place indexes "on
a GPU" with a fake.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Protocol

import faiss

from retrieval.embedder import Vectors
from retrieval.index.ann import GPU_KINDS, IndexKind
from retrieval.index.vector_search import FaissSearch, SerialSearch, TorchExactSearch, VectorSearch

logger = logging.getLogger(__name__)

# faiss-gpu reserves its scratch memory up front; at most this much of the index's share.
_MAX_FAISS_TEMP_BYTES = 1 << 30


@dataclass(frozen=True, slots=True)
class IndexPlacement:
    """`device`: auto (GPU 0 where one is seen, else the CPU), cpu, cuda (GPU 0) or cuda:N.
    `max_gpu_bytes`: the index's share of that GPU's memory (its vectors and faiss's scratch);
    None: no limit."""

    device: str = "auto"
    max_gpu_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class PlacedSearch:
    search: VectorSearch
    # Why it runs where it runs, when that is not simply where it was asked to.
    reason: str = ""


class GpuBackends(Protocol):
    def faiss_gpus(self) -> int: ...

    def torch_gpus(self) -> int: ...

    def faiss_to_gpu(self, index: Any, gpu: int, temp_memory_bytes: int | None) -> VectorSearch: ...

    def torch_exact(self, vectors: Vectors, device: str) -> VectorSearch: ...


class LocalGpus:
    """This process's GPUs as faiss-gpu (when installed) and torch see them."""

    def faiss_gpus(self) -> int:
        if not hasattr(faiss, "StandardGpuResources"):
            return 0  # faiss-cpu: get_num_gpus exists and says 0 anyway
        return int(faiss.get_num_gpus())

    def torch_gpus(self) -> int:
        import torch

        return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0

    def faiss_to_gpu(self, index: Any, gpu: int, temp_memory_bytes: int | None) -> VectorSearch:
        resources = faiss.StandardGpuResources()
        if temp_memory_bytes is not None:
            resources.setTempMemory(temp_memory_bytes)
        on_gpu = faiss.index_cpu_to_gpu(resources, gpu, index)
        return FaissSearch(on_gpu, backend="faiss-gpu", device=f"cuda:{gpu}", keep_alive=resources)

    def torch_exact(self, vectors: Vectors, device: str) -> VectorSearch:
        return TorchExactSearch(vectors, device)


def parse_gpu(device: str) -> int | None:
    """The GPU number in "cuda" or "cuda:N"; None for "cpu" and "auto"."""
    if device == "cuda":
        return 0
    if device.startswith("cuda:"):
        return int(device.removeprefix("cuda:"))
    return None


def vector_bytes(index: Any) -> int:
    return int(index.ntotal) * int(index.d) * 4


def place_index(
    index: Any,
    kind: IndexKind,
    placement: IndexPlacement,
    backends: GpuBackends | None = None,
) -> PlacedSearch:
    """Search `index` (a faiss CPU index of `kind`) where `placement` asks, or as close as can be."""
    cpu = FaissSearch(index)
    if placement.device == "cpu":
        return PlacedSearch(cpu)
    gpus = backends or LocalGpus()
    faiss_count, torch_count = gpus.faiss_gpus(), gpus.torch_gpus()
    auto = placement.device == "auto"
    gpu = 0 if auto else parse_gpu(placement.device)
    if gpu is None:
        raise ValueError(f"unknown index device {placement.device!r}")
    if auto and max(faiss_count, torch_count) == 0:
        return PlacedSearch(cpu)
    if kind not in GPU_KINDS:
        return PlacedSearch(cpu, f"{kind} is CPU-only: faiss has no GPU {kind} index")
    if gpu >= max(faiss_count, torch_count):
        return PlacedSearch(cpu, f"no GPU {gpu} (faiss sees {faiss_count}, torch {torch_count})")
    needed = vector_bytes(index)
    share = placement.max_gpu_bytes
    if share is not None and needed > share:
        return PlacedSearch(
            cpu,
            f"its vectors need {needed >> 20} MiB of cuda:{gpu}, its share is {share >> 20} MiB",
        )
    if gpu < faiss_count:
        temp = None if share is None else min(share - needed, _MAX_FAISS_TEMP_BYTES)
        return PlacedSearch(SerialSearch(gpus.faiss_to_gpu(index, gpu, temp)))
    if kind != "flat":
        return PlacedSearch(
            cpu, f"{kind} on a GPU needs faiss-gpu; torch's fallback does exact search only"
        )
    vectors = index.reconstruct_n(0, index.ntotal)
    return PlacedSearch(
        SerialSearch(gpus.torch_exact(vectors, f"cuda:{gpu}")),
        "faiss-gpu is not installed: exact search in torch",
    )
