"""Inner-product search over a fixed set of vectors, behind one small interface wherever it runs.

`FaissIndex` searches through a `VectorSearch`; `retrieval/index/placement.py` chooses which:

    FaissSearch        a faiss index (flat, IVF or HNSW) on the CPU, or a faiss-gpu index
    SerialSearch       one call at a time through another search (every search placed on a GPU)
    TorchExactSearch   exact search as a matrix product and top-k in torch, on any torch device:
                       the GPU path where faiss-gpu is not installed (PyPI has no faiss-gpu wheel
                       for every CUDA; conda does), and the CPU stand-in its tests run against

All return what faiss returns: float32 scores and int64 rows, `(queries, k)` each, best first.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from retrieval.embedder import Vectors

Scores = npt.NDArray[np.float32]
Rows = npt.NDArray[np.int64]

# The scores of one chunk of queries against every vector are held at once; this bounds them.
_SCORE_CHUNK_BYTES = 64 << 20


@runtime_checkable
class VectorSearch(Protocol):
    """`backend` and `device` say where searches run ("faiss-gpu", "cuda:0"), for logs and spans."""

    @property
    def backend(self) -> str: ...

    @property
    def device(self) -> str: ...

    @property
    def ntotal(self) -> int: ...

    def search(self, queries: Vectors, k: int, params: Any | None = None) -> tuple[Scores, Rows]:
        """The `k` best rows per query; `params`: faiss per-query parameters (IVF nprobe, HNSW
        efSearch), ignored where they do not apply."""
        ...


class FaissSearch:
    """A faiss index. CPU indexes are safe to search from several threads at once; a GPU index
    is not (see `SerialSearch`), so placement never hands one out bare."""

    def __init__(
        self,
        index: Any,
        *,
        backend: str = "faiss-cpu",
        device: str = "cpu",
        keep_alive: object = None,
    ) -> None:
        self._index = index
        self._backend = backend
        self._device = device
        # A GPU index must not outlive its StandardGpuResources.
        self._keep_alive = keep_alive

    @property
    def index(self) -> Any:
        return self._index

    @property
    def backend(self) -> str:
        return self._backend

    @property
    def device(self) -> str:
        return self._device

    @property
    def ntotal(self) -> int:
        return int(self._index.ntotal)

    def search(self, queries: Vectors, k: int, params: Any | None = None) -> tuple[Scores, Rows]:
        scores, rows = self._index.search(queries, k, params=params)
        return scores, rows


class SerialSearch:
    """One search at a time through `inner`.

    faiss GPU indexes are not thread-safe even for searches: their `StandardGpuResources`
    manages one region of scratch memory on the GPU for one user at a time (faiss wiki,
    "Threads and asynchronous calls"). The service searches from a pool of threads, so every
    search placed on a GPU goes through this lock. Kernels on one GPU queue on its stream
    anyway, so the lock costs little beyond the wait it makes explicit.
    """

    def __init__(self, inner: VectorSearch) -> None:
        self._inner = inner
        self._lock = threading.Lock()

    @property
    def backend(self) -> str:
        return self._inner.backend

    @property
    def device(self) -> str:
        return self._inner.device

    @property
    def ntotal(self) -> int:
        return self._inner.ntotal

    def search(self, queries: Vectors, k: int, params: Any | None = None) -> tuple[Scores, Rows]:
        with self._lock:
            return self._inner.search(queries, k, params)


class TorchExactSearch:
    """Exact inner-product search in torch: `queries @ vectors.T`, then top-k, in float32.

    The same top-k as faiss's flat index up to float rounding (tests/unit/test_vector_search.py,
    and `answer-service gpu-check` on a GPU). float32 matmuls on CUDA stay float32 unless
    something in the process turns TF32 on (torch's default is off for matmuls).
    """

    def __init__(self, vectors: Vectors, device: str = "cpu") -> None:
        import torch

        self._torch = torch
        host = np.ascontiguousarray(vectors, dtype=np.float32)
        self._vectors = torch.from_numpy(host).to(device)
        self._device = str(self._vectors.device)
        count = max(1, host.shape[0])
        self._chunk = max(1, _SCORE_CHUNK_BYTES // (4 * count))

    @property
    def backend(self) -> str:
        return "torch"

    @property
    def device(self) -> str:
        return self._device

    @property
    def ntotal(self) -> int:
        return int(self._vectors.shape[0])

    def search(self, queries: Vectors, k: int, params: Any | None = None) -> tuple[Scores, Rows]:
        torch = self._torch
        k = min(k, self.ntotal)
        host = np.ascontiguousarray(queries, dtype=np.float32)
        scores: list[Scores] = []
        rows: list[Rows] = []
        with torch.inference_mode():
            for start in range(0, host.shape[0], self._chunk):
                block = torch.from_numpy(host[start : start + self._chunk]).to(self._vectors.device)
                top = torch.topk(block @ self._vectors.T, k, dim=1, largest=True, sorted=True)
                scores.append(top.values.cpu().numpy().astype(np.float32, copy=False))
                rows.append(top.indices.cpu().numpy().astype(np.int64, copy=False))
        if not scores:
            return np.empty((0, k), dtype=np.float32), np.empty((0, k), dtype=np.int64)
        return np.concatenate(scores), np.concatenate(rows)


class RowSet:
    """The rows a filtered search may return, held three ways, each computed once: a boolean
    mask (BM25 zeroes the scores outside it), the sorted row numbers (an exact scan of the
    allowed rows) and the mask packed into bits, which faiss's `IDSelectorBitmap` reads in
    O(1) per candidate row (`selector()`; faiss keeps no copy, so the bits live here)."""

    __slots__ = ("_bits", "mask", "rows")

    def __init__(self, mask: npt.NDArray[np.bool_]) -> None:
        self.mask = np.ascontiguousarray(mask, dtype=np.bool_)
        self.mask.setflags(write=False)
        self.rows: Rows = np.flatnonzero(self.mask).astype(np.int64)
        self._bits = np.packbits(self.mask, bitorder="little")

    def __len__(self) -> int:
        return int(self.rows.size)

    @property
    def total(self) -> int:
        """Rows in the index the set was made for."""
        return int(self.mask.size)

    def selector(self) -> Any:
        """A faiss ID selector over these rows (made per search: it holds a pointer into
        `_bits`, which this object keeps alive while the search runs)."""
        import faiss

        return faiss.IDSelectorBitmap(self.total, faiss.swig_ptr(self._bits))
