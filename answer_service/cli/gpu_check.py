"""`answer-service gpu-check`: the embedder and exact search on a GPU against the CPU, in one
short run, written as JSON.

For the same texts, the embedder runs on the CPU and on the device (the cosine of each pair of
vectors); exact top-k search runs on the CPU (faiss) and on the device, placed as the service
places an index (faiss-gpu where installed, else torch's matrix product and top-k), over the same
vectors and queries: the same top-k per query is required, ties at the k-th score allowed.
Timings are reported side by side. Without CUDA, both sides run on the CPU (torch's exact
search against faiss), the JSON says so, and the command still exits 0 when they agree.

Exit status: 0 when the two sides agree, 1 when they do not, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from importlib.resources import files
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from retrieval.embedder import DEFAULT_EMBEDDER, Vectors
from retrieval.index.vector_search import Rows, Scores, VectorSearch

T = TypeVar("T")

DEMO_CORPUS = "postgresql-15-docs.jsonl.gz"
MIN_COSINE = 0.99  # bf16 on a GPU against the CPU measured 0.998 here (retrieval/embedder.py)


def _timed(call: Callable[[], T], repeats: int = 1) -> tuple[T, float]:
    """The last result and the median wall time of `repeats` calls, in ms."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        result = call()
        times.append((time.perf_counter() - started) * 1000.0)
    return result, statistics.median(times)


def _device(text: str) -> str:
    if text in ("auto", "cpu", "cuda") or (
        text.startswith("cuda:") and text.removeprefix("cuda:").isdigit()
    ):
        return text
    raise argparse.ArgumentTypeError(f"auto, cpu, cuda or cuda:N, not {text!r}")


def same_top_k(a: tuple[Scores, Rows], b: tuple[Scores, Rows], atol: float = 1e-4) -> list[bool]:
    """Per query, whether two top-k lists hold the same rows, rows in one only being allowed
    where they tie with the k-th score (their order within a tie is arbitrary)."""
    agree = []
    for a_scores, a_rows, b_scores, b_rows in zip(a[0], a[1], b[0], b[1], strict=True):
        a_by_row = dict(zip(a_rows.tolist(), a_scores.tolist(), strict=True))
        b_by_row = dict(zip(b_rows.tolist(), b_scores.tolist(), strict=True))
        boundary = min(float(a_scores[-1]), float(b_scores[-1])) if len(a_rows) else 0.0
        only = [a_by_row[r] for r in a_by_row.keys() - b_by_row.keys()]
        only += [b_by_row[r] for r in b_by_row.keys() - a_by_row.keys()]
        agree.append(all(score <= boundary + atol for score in only))
    return agree


def _texts(count: int, queries: int) -> tuple[list[str], list[str]]:
    """Passages (a document's opening, which the embedder truncates) and questions-like titles
    from the bundled PostgreSQL manual."""
    from retrieval.corpus import read_corpus

    corpus = Path(str(files("answer_service").joinpath("demo_corpus", DEMO_CORPUS)))
    documents = [d for d in read_corpus(corpus) if d.text.strip() and d.title.strip()]
    passages = [f"{d.title}\n{d.text[:1500]}" for d in documents[:count]]
    step = max(1, len(documents) // max(1, queries))
    titles = list(dict.fromkeys(d.title for d in documents[::step]))[:queries]
    return passages, [f"What does the manual say about {title}?" for title in titles]


def _host() -> dict[str, Any]:
    import faiss
    import torch

    cuda = torch.cuda.is_available()
    names = (
        [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else []
    )
    return {
        "machine": platform.machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": cuda,
        "gpus": names,
        "faiss": faiss.__version__,
        "faiss_gpus": int(faiss.get_num_gpus()) if hasattr(faiss, "StandardGpuResources") else 0,
    }


def _embed_side(model: str, device: str, passages: list[str], queries: list[str]) -> dict[str, Any]:
    from retrieval.embedder import EmbedderConfig, SentenceTransformerEmbedder, pick_dtype

    embedder = SentenceTransformerEmbedder(EmbedderConfig(model=model, device=device))
    _, load_ms = _timed(embedder.warm_up)
    passage_vectors, passages_ms = _timed(lambda: embedder.encode(passages, batch_size=32))
    query_vectors, queries_ms = _timed(lambda: embedder.encode(queries, batch_size=32), 3)
    one = queries[:1]
    _, one_ms = _timed(lambda: embedder.encode(one, batch_size=1), 5)
    return {
        "device": device,
        "dtype": pick_dtype("auto", device),
        "load_ms": round(load_ms, 1),
        "passages_ms": round(passages_ms, 1),
        "queries_batch_ms": round(queries_ms, 2),
        "one_query_ms": round(one_ms, 2),
        "_passages": passage_vectors,
        "_queries": query_vectors,
    }


def _search_side(search: VectorSearch, queries: Vectors, k: int) -> dict[str, Any]:
    search.search(queries[:1], k)  # first call: kernels, allocations
    found, batch_ms = _timed(lambda: search.search(queries, k), 5)
    _, one_ms = _timed(lambda: search.search(queries[:1], k), 20)
    return {
        "backend": search.backend,
        "device": search.device,
        "batch_ms": round(batch_ms, 3),
        "one_query_ms": round(one_ms, 3),
        "_found": found,
    }


def _other_search(vectors: Vectors, device: str) -> tuple[VectorSearch, str]:
    """The search the service would use on `device` (torch's exact search on the CPU), and
    why it runs where it does."""
    import faiss

    from retrieval.index.placement import IndexPlacement, place_index
    from retrieval.index.vector_search import TorchExactSearch

    if device == "cpu":
        return TorchExactSearch(vectors, "cpu"), "torch's exact search, the GPU fallback"
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors)
    placed = place_index(index, "flat", IndexPlacement(device))
    return placed.search, placed.reason or "as asked"


def _database(passages: Vectors, total: int, seed: int = 0) -> Vectors:
    """The passages' vectors, then random unit vectors up to `total`."""
    filler = np.random.default_rng(seed).normal(
        size=(max(0, total - len(passages)), passages.shape[1])
    )
    filler /= np.linalg.norm(filler, axis=1, keepdims=True)
    return np.ascontiguousarray(np.vstack([passages, filler.astype(np.float32)]), dtype=np.float32)


def _cosines(a: Vectors, b: Vectors) -> np.ndarray:
    """Row by row, in float64: a bf16 embedder's vectors are unit length only to ~1e-3."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    norms = np.linalg.norm(a64, axis=1) * np.linalg.norm(b64, axis=1)
    return np.asarray(np.sum(a64 * b64, axis=1) / norms)


def _public(side: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in side.items() if not key.startswith("_")}


def compared_device(asked: str, gpus: int) -> tuple[str, str]:
    """The device compared with the CPU, and a note where it is not the one asked for."""
    if asked == "auto":
        asked = "cuda:0" if gpus else "cpu"
    gpu = 0 if asked == "cuda" else int(asked.removeprefix("cuda:")) if ":" in asked else None
    if gpu is not None and gpu >= gpus:
        return "cpu", f"{asked} asked for, torch sees {gpus} GPU(s): both sides ran on the CPU"
    if gpu is None:
        why = "no CUDA here" if gpus == 0 else "--device cpu"
        return "cpu", f"{why}: both sides ran on the CPU (faiss against torch's exact search)"
    return f"cuda:{gpu}", ""


def run_check(args: argparse.Namespace) -> dict[str, Any]:
    import faiss

    from retrieval.index.vector_search import FaissSearch

    host = _host()
    device, note = compared_device(args.device, len(host["gpus"]))
    passages, queries = _texts(args.texts, args.queries)

    cpu_embed = _embed_side(args.embedder, "cpu", passages, queries)
    other_embed = _embed_side(args.embedder, device, passages, queries)
    cosines = np.concatenate(
        [
            _cosines(cpu_embed["_queries"], other_embed["_queries"]),
            _cosines(cpu_embed["_passages"], other_embed["_passages"]),
        ]
    )

    vectors = _database(cpu_embed["_passages"], args.vectors)
    flat = faiss.IndexFlatIP(vectors.shape[1])
    flat.add(vectors)
    cpu_search = _search_side(FaissSearch(flat), cpu_embed["_queries"], args.k)
    other, why = _other_search(vectors, device)
    other_search = {**_search_side(other, cpu_embed["_queries"], args.k), "why": why}
    agree = same_top_k(cpu_search["_found"], other_search["_found"])
    # End to end: each side's own query vectors through its own search.
    end_to_end = other.search(other_embed["_queries"], args.k)
    overlap = [
        len(set(a.tolist()) & set(b.tolist())) / args.k
        for a, b in zip(cpu_search["_found"][1], end_to_end[1], strict=True)
    ]
    min_cosine = float(np.min(cosines))
    ok = all(agree) and min_cosine >= MIN_COSINE
    return {
        "command": "answer-service gpu-check",
        "host": host,
        "device": device,
        "note": note,
        "embedder": {
            "model": args.embedder,
            "texts": len(passages),
            "queries": len(queries),
            "cpu": _public(cpu_embed),
            "other": _public(other_embed),
            "min_cosine": round(min_cosine, 6),
            "mean_cosine": round(float(np.mean(cosines)), 6),
        },
        "search": {
            "vectors": int(vectors.shape[0]),
            "dimension": int(vectors.shape[1]),
            "queries": len(queries),
            "k": args.k,
            "cpu": _public(cpu_search),
            "other": _public(other_search),
            "same_top_k": sum(agree) / len(agree),
            "queries_differing": len(agree) - sum(agree),
            "end_to_end_top_k_overlap": round(float(np.mean(overlap)), 4),
        },
        "ok": ok,
    }


def _gpu_check(args: argparse.Namespace) -> int:
    if min(args.texts, args.queries, args.vectors, args.k) < 1 or args.vectors < args.texts:
        print("error: --texts, --queries, --k >= 1 and --vectors >= --texts", file=sys.stderr)
        return 2
    report = run_check(args)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0 if report["ok"] else 1


def add_gpu_check_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    check = commands.add_parser(
        "gpu-check", help="the embedder and exact search on a GPU against the CPU, as JSON"
    )
    check.add_argument(
        "--device",
        type=_device,
        default="auto",
        help="the side compared with the CPU: auto (cuda:0 where torch sees CUDA), cpu, cuda:N",
    )
    check.add_argument("--embedder", default=DEFAULT_EMBEDDER)
    check.add_argument("--texts", type=int, default=256, help="passages embedded on each side")
    check.add_argument("--queries", type=int, default=64)
    check.add_argument("--vectors", type=int, default=100_000, help="vectors searched")
    check.add_argument("--k", type=int, default=10)
    check.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    check.set_defaults(run=_gpu_check)
