"""The reader: a cross-encoder that reads the question and a candidate sentence together and
says how likely the sentence is to answer it, for the few sentences the scorer ranks best.

The scorer (scorer.py) sees each sentence through features: word overlap, the stored vectors'
cosine, where it sits. It cannot tell which of two sentences about the same thing holds what
is asked ("Who designed it?" against a sentence on when it was designed). A cross-encoder
can, at the price of one encoder pass per pair, so it reads only the scorer's best `depth`
candidates.

No cross-encoder weights can be had on every machine, so the reader is the embedder's own
packaged MiniLM encoder with small learned changes: low-rank adapters (LoRA) on the linear
layers of each transformer layer, its layer norms, and a one-logit head over the mean of the
pair's token states. Only those ship (`reader.npz`, about a megabyte), learned by
`python -m eval.calibrate.sentence_reader`; at load they are merged into the encoder's
weights, so a request costs one plain encoder pass over its pairs.

The adapter's file format is reader_adapter.py's.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from retrieval.embedder import (
    DEFAULT_EMBEDDER,
    pick_device,
    pick_dtype,
    pick_runtime,
    resolve_model_path,
)
from retrieval.errors import RetrievalError
from retrieval.sentences.reader_adapter import (
    ADAPTER_FILE,
    TARGETS,
    ReaderMeta,
    pair_text,
    read_adapter,
    write_adapter,
)
from retrieval.sentences.scorer import Candidate, ScoredSentence, weights_file_text

logger = logging.getLogger(__name__)

__all__ = [
    "ADAPTER_FILE",
    "TARGETS",
    "ReaderMeta",
    "SentenceReader",
    "pair_text",
    "read_adapter",
    "write_adapter",
]


@dataclass(frozen=True, slots=True)
class ReadMix:
    """How the reader's scores join the scorer's, learned with the scorer
    (`python -m eval.calibrate.sentence_scorer`, the `reader` object of its weights file).

    The reader reads only where the scorer is in doubt: when the scorer's chance that its best
    quotable sentence is the one that answers (a softmax of its scores over the quotable
    sentences) is below `doubt`. Then it reads the `depth` best quotable sentences, and each
    sentence's score becomes the scorer's plus `weight` x the reader's (a sentence it did not
    read counts the lowest it gave). The combined score is calibrated to a probability by
    sigmoid(slope x score + intercept), whether the reader read or not."""

    depth: int = 4
    doubt: float = 0.6
    weight: float = 0.5
    slope: float = 1.0
    intercept: float = 0.0

    @classmethod
    def read(cls, path: Path | None = None) -> ReadMix | None:
        """The mix in the scorer's weights file (`path`, or the package's); None where the
        weights were learned without a reader."""
        try:
            text = weights_file_text(path)
            raw = json.loads(text).get("reader")
            if raw is None:
                return None
            return cls(
                int(raw["depth"]),
                float(raw["doubt"]),
                float(raw["weight"]),
                float(raw["slope"]),
                float(raw["intercept"]),
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise RetrievalError(f"cannot read the sentence reader's mix: {exc}") from exc

    def to_json(self) -> dict[str, float | int]:
        return {
            "depth": self.depth,
            "doubt": self.doubt,
            "weight": self.weight,
            "slope": self.slope,
            "intercept": self.intercept,
        }


def quotable(sentence: ScoredSentence) -> bool:
    return sentence.candidate.ref.whole and sentence.candidate.ref.kind != "code"


def best_chance(ranked: Sequence[ScoredSentence]) -> float:
    """The scorer's chance that its best quotable sentence is the one that answers (1 where
    nothing is quotable: there is nothing to read)."""
    scores = [s.score for s in ranked if quotable(s)]
    if not scores:
        return 1.0
    top = max(scores)
    return 1.0 / sum(math.exp(v - top) for v in scores)


Read = Callable[[Sequence[Candidate]], npt.NDArray[np.float64]]
"""The reader's score of each candidate (blocking)."""


def to_read(ranked: Sequence[ScoredSentence], mix: ReadMix) -> list[ScoredSentence]:
    """What the reader reads of a first-pass ranking (best first): nothing where the scorer
    is sure, else its `depth` best quotable sentences."""
    if best_chance(ranked) >= mix.doubt:
        return []
    return [s for s in ranked if quotable(s)][: mix.depth]


def reread(
    ranked: Sequence[ScoredSentence], mix: ReadMix, read: Read | None
) -> tuple[list[ScoredSentence], int]:
    """The first pass reordered by the mix, best first, and how many sentences were read
    (`read` None: none, as when the reader had no time)."""
    chosen = to_read(ranked, mix) if read is not None else []
    values: Sequence[float] = (
        read([s.candidate for s in chosen]).tolist() if read is not None and chosen else []
    )
    by_id = {id(s): float(v) for s, v in zip(chosen, values, strict=True)}
    floor = min(by_id.values(), default=0.0)
    combined = [s.score + (mix.weight * by_id.get(id(s), floor) if by_id else 0.0) for s in ranked]
    order = sorted(range(len(ranked)), key=lambda i: -combined[i])
    out = []
    for i in order:
        z = max(-30.0, min(30.0, mix.slope * combined[i] + mix.intercept))
        probability = 1.0 / (1.0 + math.exp(-z))
        out.append(
            ScoredSentence(ranked[i].candidate, probability, ranked[i].features, combined[i])
        )
    return out, len(chosen)


class Reader(Protocol):
    """Scores (question, sentence) pairs; blocking."""

    @property
    def name(self) -> str: ...

    def read(self, question: str, found: Sequence[Candidate]) -> npt.NDArray[np.float64]: ...


@dataclass(frozen=True, slots=True)
class ReaderConfig:
    # The adapter file (None: the package's).
    adapter: Path | None = None
    device: str = "auto"
    # auto: ONNX Runtime on the CPU (the merged encoder exported once, as the embedder's is:
    # retrieval/onnx_encoder.py), torch elsewhere.
    runtime: str = "auto"
    # auto: int8 under ONNX Runtime; under torch, the embedder's choice (`pick_dtype`).
    dtype: str = "auto"
    batch_size: int = 16
    # Where ONNX Runtime's exported files are kept.
    cache_dir: Path = Path.home() / ".cache" / "answer-service"


class SentenceReader:
    """The reader; cheap to build, loads and merges its weights in `warm_up()`."""

    def __init__(
        self,
        config: ReaderConfig,
        embedder_model: str = DEFAULT_EMBEDDER,
        what: str = "sentence reader",
        learn_with: str = "python -m eval.calibrate.sentence_reader",
    ) -> None:
        self._config = config
        self._embedder_model = embedder_model
        # What the adapter is and what learns one, in messages (the builtin passage reranker is
        # one too).
        self._what = what
        self._learn_with = learn_with
        self._model: Any = None
        self._tokenizer: Any = None
        self._meta: ReaderMeta | None = None
        self._device = "cpu"
        self._dtype = "float32"
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return f"reader({self._embedder_model})"

    @property
    def meta(self) -> ReaderMeta | None:
        """The adapter's metadata, once warmed up."""
        return self._meta

    def warm_up(self) -> None:
        if self._model is not None:
            return
        from retrieval.sentences.reader_model import PairModel

        meta, arrays = read_adapter(self._config.adapter)
        if meta.base != self._embedder_model:
            raise RetrievalError(
                f"the {self._what} adapts {meta.base!r}, the embedder is "
                f"{self._embedder_model!r}: learn one for it with {self._learn_with}"
            )
        base_dir = resolve_model_path(meta.base)
        self._device = pick_device(self._config.device)
        runtime = pick_runtime(self._config.runtime, self._device, base_dir)
        self._dtype = pick_dtype(self._config.dtype, self._device, runtime)
        try:
            if runtime == "onnx":
                from transformers import AutoTokenizer

                self._model = _OnnxPairs(
                    Path(base_dir), meta, arrays, self._dtype, self._config.cache_dir
                )
                self._tokenizer = AutoTokenizer.from_pretrained(base_dir)
            else:
                model, self._tokenizer = PairModel.merged(base_dir, meta, arrays)
                self._model = model.to(self._device).eval()
        except (OSError, ValueError, KeyError) as exc:
            raise RetrievalError(f"cannot load the {self._what}: {exc}") from exc
        self._meta = meta
        self.scores("warm-up question", [("warm-up sentence", "")])
        logger.info(
            "%s loaded base=%s device=%s runtime=%s dtype=%s",
            self._what,
            meta.base,
            self._device,
            runtime,
            self._dtype,
        )

    def read(self, question: str, found: Sequence[Candidate]) -> npt.NDArray[np.float64]:
        """The reader's logit for each candidate sentence. Blocking."""
        return self.scores(question, [(c.with_term, c.passage.title) for c in found])

    def scores(
        self, question: str, sentences: Sequence[tuple[str, str]]
    ) -> npt.NDArray[np.float64]:
        """The reader's logit for each (sentence text, passage title). Blocking."""
        if not sentences:
            return np.zeros(0)
        if self._model is None or self._meta is None:
            self.warm_up()
        assert self._meta is not None
        meta = self._meta
        seconds = [pair_text(text, title, meta.with_title) for text, title in sentences]
        out: list[float] = []
        with self._lock:
            for start in range(0, len(seconds), self._config.batch_size):
                batch = seconds[start : start + self._config.batch_size]
                out.extend(self._logits([question] * len(batch), batch, meta.max_tokens))
        return np.asarray(out, dtype=np.float64)

    def _logits(self, questions: list[str], seconds: list[str], max_tokens: int) -> list[float]:
        onnx = isinstance(self._model, _OnnxPairs)
        encoded = self._tokenizer(
            questions,
            seconds,
            truncation="longest_first",
            max_length=max_tokens,
            padding=True,
            return_tensors="np" if onnx else "pt",
        )
        if onnx:
            return [float(v) for v in self._model.logits(encoded)]
        import torch

        with (
            torch.inference_mode(),
            torch.autocast(
                self._device.split(":")[0],
                dtype=torch.bfloat16,
                enabled=self._dtype == "bfloat16",
            ),
        ):
            logits = self._model(**encoded.to(self._device))
        return [float(v) for v in logits.float().cpu()]


class _OnnxPairs:
    """The reader under ONNX Runtime (`adapted_session`); the mean of its token states and the
    head in numpy."""

    def __init__(
        self,
        base_dir: Path,
        meta: ReaderMeta,
        arrays: dict[str, npt.NDArray[Any]],
        dtype: str,
        cache_dir: Path,
    ) -> None:
        from retrieval.sentences.reader_adapter import adapted_session

        scale = meta.alpha / meta.rank
        self._session = adapted_session(base_dir, scale, arrays, dtype, cache_dir)
        self._weight = np.asarray(arrays["head/weight"], dtype=np.float32).reshape(-1)
        self._bias = float(np.asarray(arrays["head/bias"]).reshape(-1)[0])

    def logits(self, encoded: Any) -> npt.NDArray[np.float32]:
        from retrieval.onnx_encoder import run_states

        states = run_states(self._session, encoded)
        mask = np.asarray(encoded["attention_mask"], dtype=np.float32)[..., None]
        pooled = (states * mask).sum(axis=1) / np.maximum(mask.sum(axis=1), 1.0)
        out: npt.NDArray[np.float32] = pooled @ self._weight + self._bias
        return out
