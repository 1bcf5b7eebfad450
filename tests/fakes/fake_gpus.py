"""GPUs for index placement without a GPU: honours `retrieval.index.placement.GpuBackends`.

A "GPU index" here is the real CPU search wrapped in `CountingSearch`, which records how many
threads are inside `search` at once and lingers there so that overlapping calls really overlap.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from retrieval.embedder import Vectors
from retrieval.index.vector_search import (
    FaissSearch,
    Rows,
    Scores,
    TorchExactSearch,
    VectorSearch,
)


class CountingSearch:
    def __init__(self, inner: VectorSearch, backend: str, device: str, dwell_s: float) -> None:
        self._inner = inner
        self._backend = backend
        self._device = device
        self._dwell_s = dwell_s
        self._lock = threading.Lock()
        self.active = 0
        self.max_active = 0
        self.calls = 0

    @property
    def backend(self) -> str:
        return self._backend

    @property
    def device(self) -> str:
        return self._device

    @property
    def ntotal(self) -> int:
        return self._inner.ntotal

    def search(self, queries: Vectors, k: int, params: Any | None = None) -> tuple[Scores, Rows]:
        with self._lock:
            self.active += 1
            self.calls += 1
            self.max_active = max(self.max_active, self.active)
        try:
            time.sleep(self._dwell_s)
            return self._inner.search(queries, k, params)
        finally:
            with self._lock:
                self.active -= 1


class FakeGpus:
    """`faiss_count` GPUs that faiss-gpu sees, `torch_count` that torch sees."""

    def __init__(self, faiss_count: int = 1, torch_count: int = 1, dwell_s: float = 0.005) -> None:
        self._faiss_count = faiss_count
        self._torch_count = torch_count
        self._dwell_s = dwell_s
        self.placed: list[CountingSearch] = []
        self.temp_memory_bytes: list[int | None] = []

    def faiss_gpus(self) -> int:
        return self._faiss_count

    def torch_gpus(self) -> int:
        return self._torch_count

    def faiss_to_gpu(self, index: Any, gpu: int, temp_memory_bytes: int | None) -> VectorSearch:
        self.temp_memory_bytes.append(temp_memory_bytes)
        return self._counted(FaissSearch(index), "faiss-gpu", f"cuda:{gpu}")

    def torch_exact(self, vectors: Vectors, device: str) -> VectorSearch:
        return self._counted(TorchExactSearch(vectors, "cpu"), "torch", device)

    def _counted(self, inner: VectorSearch, backend: str, device: str) -> CountingSearch:
        search = CountingSearch(inner, backend, device, self._dwell_s)
        self.placed.append(search)
        return search
