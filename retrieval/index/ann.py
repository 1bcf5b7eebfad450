"""Which faiss index serves a corpus, how deep each query searches it, and where it runs.

Exact (flat) search for small corpora; IVF or HNSW above `flat_max_passages`. The kind is
decided once at build time from the passage count (or forced) and recorded in the manifest;
the depth of each query (`nprobe` for IVF, `efSearch` for HNSW) is the caller's to choose.
Flat and IVF indexes move to the GPU when faiss reports one; HNSW stays on the CPU (faiss
has no GPU HNSW).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Literal

import faiss
import numpy as np

logger = logging.getLogger(__name__)

IndexKind = Literal["flat", "ivf", "hnsw"]


@dataclass(frozen=True, slots=True)
class AnnConfig:
    kind: Literal["auto", "flat", "ivf", "hnsw"] = "auto"
    flat_max_passages: int = 50_000
    # auto above flat_max_passages: IVF (smaller, trains in seconds) unless HNSW is asked for.
    large_kind: Literal["ivf", "hnsw"] = "ivf"
    nlist: int | None = None  # IVF lists; None: about 4 x sqrt(n)
    hnsw_m: int = 32
    hnsw_ef_construction: int = 80
    train_sample: int = 100_000

    def resolve(self, passage_count: int) -> IndexKind:
        if self.kind != "auto":
            return self.kind
        return "flat" if passage_count <= self.flat_max_passages else self.large_kind

    def lists_for(self, passage_count: int) -> int:
        if self.nlist is not None:
            return self.nlist
        return max(1, min(passage_count // 39, int(4 * math.sqrt(passage_count))))


@dataclass(frozen=True, slots=True)
class SearchDepth:
    """Per-query depth: `nprobe` for IVF lists visited, `ef_search` for HNSW candidates."""

    nprobe: int | None = None
    ef_search: int | None = None


def build_search_index(flat: Any, kind: IndexKind, config: AnnConfig) -> Any:
    """Turn the flat index written during streaming into the index of `kind`."""
    if kind == "flat":
        return flat
    count, dimension = flat.ntotal, flat.d
    vectors = flat.reconstruct_n(0, count)
    if kind == "hnsw":
        hnsw = faiss.IndexHNSWFlat(dimension, config.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        hnsw.hnsw.efConstruction = config.hnsw_ef_construction
        hnsw.add(vectors)
        return hnsw
    nlist = config.lists_for(count)
    quantizer = faiss.IndexFlatIP(dimension)
    index = faiss.IndexIVFFlat(quantizer, dimension, nlist, faiss.METRIC_INNER_PRODUCT)
    rng = np.random.default_rng(0)
    sample = vectors[rng.choice(count, size=min(count, config.train_sample), replace=False)]
    index.train(sample)
    index.add(vectors)
    logger.info("ivf built lists=%d passages=%d", nlist, count)
    return index


def search_parameters(kind: IndexKind, depth: SearchDepth | None) -> Any | None:
    """faiss per-query parameters for `depth`, or None to use the index's defaults."""
    if depth is None:
        return None
    if kind == "ivf" and depth.nprobe is not None:
        return faiss.SearchParametersIVF(nprobe=depth.nprobe)  # type: ignore[call-arg]  # stubs lag
    if kind == "hnsw" and depth.ef_search is not None:
        return faiss.SearchParametersHNSW(efSearch=depth.ef_search)  # type: ignore[attr-defined]
    return None


def gpu_count() -> int:
    return int(faiss.get_num_gpus()) if hasattr(faiss, "get_num_gpus") else 0


def maybe_to_gpu(index: Any, device: Literal["auto", "cpu", "cuda"]) -> tuple[Any, str]:
    """Move a flat or IVF index to GPU 0 where asked (or auto and one is there)."""
    if device == "cpu" or isinstance(index, faiss.IndexHNSWFlat):
        return index, "cpu"
    if gpu_count() == 0 or not hasattr(faiss, "StandardGpuResources"):
        if device == "cuda":
            logger.warning("faiss reports no GPU; searching on the CPU")
        return index, "cpu"
    resources = faiss.StandardGpuResources()
    gpu_index = faiss.index_cpu_to_gpu(resources, 0, index)
    # Keep the resources alive as long as the index.
    gpu_index.referenced_resources = resources  # type: ignore[attr-defined]
    return gpu_index, "cuda"
