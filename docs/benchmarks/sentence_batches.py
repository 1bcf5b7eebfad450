"""Ways to embed a build's sentence vectors, side by side in one run on the same sentences.

    python docs/benchmarks/sentence_batches.py --index DIR --sample 2000 \
        --out docs/benchmarks/sentence-batches.json

The sentences are those `SentenceStore.build` embeds for the index's passages (each distinct
text once: no code, no heading, nothing under its word floor), an even sample over their
lengths. Variants, each on MiniLM-L6 on the CPU: `shipped` (sorted by length, batches of 128,
lengths padded to a multiple of 16, as a build does today), `batch-32`, `unpadded` (no length
buckets: a build need not bound the shapes it runs, a serving process must), `int8` (torch's
dynamic int8 quantization of the linear layers). The sample is cut into rounds and every
variant runs each round in turn, so a load that changes meanwhile falls on all alike. Reported:
sentences/s per variant, its ratio to `shipped`, and the cosine of its vectors to `shipped`'s
(min and mean): a vector that moves can change which sentence is quoted. Lives here, not in
eval/bench/, because eval/ is at its line limit.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from retrieval.embedder import EmbedderConfig, SentenceTransformerEmbedder
from retrieval.index.faiss_index import read_passages
from retrieval.sentences.store import SentenceStore

ROUNDS = 8
Encode = Callable[[Sequence[str]], npt.NDArray[np.float32]]


class _Recorder:
    """An embedder that keeps the texts it is asked for and returns zeros."""

    def __init__(self, dimension: int) -> None:
        self.texts: list[str] = []
        self._dimension = dimension

    @property
    def dimension(self) -> int:
        return self._dimension

    def encode(self, texts: Sequence[str], *, batch_size: int = 32) -> npt.NDArray[np.float32]:
        self.texts.extend(texts)
        return np.zeros((len(texts), self._dimension), dtype=np.float32)


def _variants() -> dict[str, Encode]:
    import torch

    shipped = SentenceTransformerEmbedder(EmbedderConfig(device="cpu"))
    unpadded = SentenceTransformerEmbedder(EmbedderConfig(device="cpu", pad_to_multiple_of=1))
    quantized = SentenceTransformerEmbedder(EmbedderConfig(device="cpu"))
    for embedder in (shipped, unpadded, quantized):
        embedder.warm_up()
    model = quantized._loaded()
    quantized._model = torch.ao.quantization.quantize_dynamic(
        model, {torch.nn.Linear}, dtype=torch.qint8
    )
    return {
        "shipped": lambda texts: shipped.encode(texts, batch_size=128),
        "batch-32": lambda texts: shipped.encode(texts, batch_size=32),
        "unpadded": lambda texts: unpadded.encode(texts, batch_size=128),
        "int8": lambda texts: quantized.encode(texts, batch_size=128),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--index", type=Path, required=True, help="an index folder (current/)")
    parser.add_argument("--sample", type=int, default=2000)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    passages = list(read_passages(args.index / "passages.jsonl"))
    recorder = _Recorder(384)
    SentenceStore.build(passages, recorder)  # type: ignore[arg-type]
    texts = sorted(recorder.texts, key=len)
    step = max(1, len(texts) // args.sample)
    sample = texts[::step][: args.sample]
    variants = _variants()
    seconds = dict.fromkeys(variants, 0.0)
    vectors: dict[str, list[npt.NDArray[np.float32]]] = {name: [] for name in variants}
    # Round r holds every ROUNDS-th sentence from r: each round spans all lengths.
    for r in range(ROUNDS):
        chunk = sorted(sample[r::ROUNDS], key=len)
        for name, encode in variants.items():
            started = time.perf_counter()
            vectors[name].append(encode(chunk))
            seconds[name] += time.perf_counter() - started
    reference = np.vstack(vectors["shipped"])
    results: dict[str, Any] = {}
    for name in variants:
        cosine = np.sum(np.vstack(vectors[name]) * reference, axis=1)
        results[name] = {
            "seconds": round(seconds[name], 2),
            "sentences_per_s": round(len(sample) / seconds[name], 1),
            "time_vs_shipped": round(seconds[name] / seconds["shipped"], 3),
            "cosine_to_shipped_min": round(float(cosine.min()), 4),
            "cosine_to_shipped_mean": round(float(cosine.mean()), 5),
        }
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    result = {
        "command": f"python docs/benchmarks/sentence_batches.py --sample {args.sample}",
        "commit": commit,
        "machine": f"{os.cpu_count()} cores, shared with other sessions' work",
        "load_1min": [round(x, 2) for x in os.getloadavg()],
        "index_passages": len(passages),
        "distinct_sentences": len(texts),
        "sampled": len(sample),
        "variants": results,
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
