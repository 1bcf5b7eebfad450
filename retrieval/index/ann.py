"""Which faiss index serves a corpus, how deep each query searches it, and where it runs.

Exact (flat) search for small corpora; IVF or HNSW above `flat_max_passages`. The kind is
decided once at build time from the passage count (or forced) and recorded in the manifest;
the depth of each query (`nprobe` for IVF, `efSearch` for HNSW) is the caller's to choose.
Flat and IVF indexes can be searched on a GPU (`GPU_KINDS`); HNSW is CPU-only, because faiss
has no GPU HNSW index. Where each one runs is decided at load time by `placement.py`.
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
# The kinds faiss-gpu can search (an HNSW index asked onto a GPU stays on the CPU, and says so).
GPU_KINDS: frozenset[IndexKind] = frozenset({"flat", "ivf"})


@dataclass(frozen=True, slots=True)
class AnnConfig:
    kind: Literal["auto", "flat", "ivf", "hnsw"] = "auto"
    flat_max_passages: int = 50_000
    # auto above flat_max_passages: IVF (smaller, trains in seconds) unless HNSW is asked for.
    # HNSW is searched on the CPU even where a GPU is configured (faiss has no GPU HNSW).
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


def search_parameters(
    kind: IndexKind, depth: SearchDepth | None, selector: Any | None = None
) -> Any | None:
    """faiss per-query parameters for `depth` and, for a filtered search, the ID `selector`
    that faiss applies inside the search (faiss >= 1.7.3); None: the index's defaults."""
    extra: dict[str, Any] = {} if selector is None else {"sel": selector}
    if kind == "ivf" and depth is not None and depth.nprobe is not None:
        return faiss.SearchParametersIVF(nprobe=depth.nprobe, **extra)  # type: ignore[call-arg]
    if kind == "hnsw" and depth is not None and depth.ef_search is not None:
        return faiss.SearchParametersHNSW(efSearch=depth.ef_search, **extra)  # type: ignore[attr-defined]
    if selector is None:
        return None
    if kind == "ivf":
        return faiss.SearchParametersIVF(**extra)
    if kind == "hnsw":
        return faiss.SearchParametersHNSW(**extra)  # type: ignore[attr-defined]
    return faiss.SearchParameters(**extra)
