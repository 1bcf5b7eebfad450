"""The short answer: the few words of a quoted sentence that answer the question.

A quote is a whole sentence (thirty words for a two-word answer). The span head reads
"question [SEP] sentence" with the embedder's packaged MiniLM (low-rank adapters merged in at
load, as the sentence reader's are) and scores each sentence token as the answer's start and as
its end (one linear layer over the token states). The best span (end not before start, at most
`max_answer_tokens` tokens) is mapped back through the tokenizer's offsets to characters of the
unchanged sentence, so `sentence[start:end] == text` always holds.

Its score is the span's probability: the softmax of the start logits times that of the end
logits, over the sentence's tokens and [CLS] (which stands for "no answer here": the head was
trained to point there on sentences that do not hold the answer). A span is given only where
its score clears `threshold`, chosen on SQuAD train articles the head did not learn from (a
wrong short answer is worse than none: the quote is still there). The weights, their meta and
the threshold ship in `span.npz` (about a megabyte), learned by
`python -m retrieval.sentences.span_train`.

File format: reader_adapter.py's names (`lora/...`, `norm/...`), `head/weight|bias` (2 x
hidden: start, end) and `meta` (JSON: base, rank, alpha, max_tokens, max_answer_tokens,
threshold).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
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
from retrieval.sentences.reader_adapter import read_weights, write_weights

logger = logging.getLogger(__name__)

SPAN_FILE = "span.npz"


@dataclass(frozen=True, slots=True)
class SpanMeta:
    """How the span head was trained (so how it must be read) and its threshold."""

    base: str = DEFAULT_EMBEDDER
    rank: int = 8
    alpha: float = 16.0
    max_tokens: int = 160
    max_answer_tokens: int = 30
    threshold: float = 0.5

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> SpanMeta:
        raw = json.loads(text)
        return cls(**{field.name: raw[field.name] for field in dataclasses.fields(cls)})


@dataclass(frozen=True, slots=True)
class ShortSpan:
    """A span of one sentence: `sentence[start:end] == text`; `score` its probability."""

    text: str
    start: int
    end: int
    score: float


def log_softmax(logits: npt.NDArray[np.float64], allowed: npt.NDArray[np.bool_]) -> Any:
    masked = np.where(allowed, logits, -np.inf)
    top = masked.max()
    return masked - top - np.log(np.exp(masked - top).sum())


def best_span(
    start_logits: npt.NDArray[np.float64],
    end_logits: npt.NDArray[np.float64],
    in_sentence: npt.NDArray[np.bool_],
    max_answer_tokens: int,
) -> tuple[int, int, float] | None:
    """The best (first token, last token, probability) over the sentence's tokens, end not
    before start and at most `max_answer_tokens` long. The softmaxes run over the sentence's
    tokens and position 0 ([CLS], "no answer"), so a span's probability is low where the head
    points at [CLS]. None where the sentence has no token."""
    if not in_sentence.any():
        return None
    allowed = in_sentence.copy()
    allowed[0] = True
    log_start = log_softmax(start_logits, allowed)
    log_end = log_softmax(end_logits, allowed)
    tokens = np.flatnonzero(in_sentence)
    pair = log_start[tokens][:, None] + log_end[tokens][None, :]
    gap = tokens[None, :] - tokens[:, None]
    pair = np.where((gap >= 0) & (gap < max_answer_tokens), pair, -np.inf)
    flat = int(np.argmax(pair))
    first, last = divmod(flat, len(tokens))
    return int(tokens[first]), int(tokens[last]), float(np.exp(pair[first, last]))


def char_span(offsets: Sequence[tuple[int, int]], first: int, last: int) -> tuple[int, int]:
    """Characters of the sentence from token `first` through token `last` (the tokenizer's
    offsets into the sentence it was given)."""
    return offsets[first][0], offsets[last][1]


def whole_words(sentence: str, start: int, end: int) -> tuple[int, int]:
    """[start, end) widened to whole words: a span never starts or ends inside a word (a
    word-piece such as "br" of "brûlée" reads as the word)."""
    while 0 < start < len(sentence) and sentence[start - 1].isalnum() and sentence[start].isalnum():
        start -= 1
    while 0 < end < len(sentence) and sentence[end].isalnum() and sentence[end - 1].isalnum():
        end += 1
    return start, end


def token_span(
    offsets: Sequence[tuple[int, int]], in_sentence: Sequence[bool], start: int, end: int
) -> tuple[int, int] | None:
    """The first and last sentence tokens that overlap characters [start, end); None where
    none does (the answer was cut off by truncation)."""
    hit = [
        i for i, (a, b) in enumerate(offsets) if in_sentence[i] and b > a and a < end and b > start
    ]
    return (hit[0], hit[-1]) if hit else None


def read_span_file(path: Path | None = None) -> tuple[SpanMeta, dict[str, npt.NDArray[Any]]]:
    """The span head in `path`, or the one shipped with the package."""
    meta, arrays = read_weights(path, SPAN_FILE, "the span head")
    try:
        return SpanMeta.from_json(meta), arrays
    except (ValueError, KeyError) as exc:
        raise RetrievalError(f"cannot read the span head: {exc}") from exc


def write_span_file(path: Path, meta: SpanMeta, arrays: dict[str, npt.NDArray[Any]]) -> None:
    write_weights(path, meta.to_json(), arrays)


class ShortFinder(Protocol):
    """Finds the short answer in a sentence, or says there is none it is sure of; blocking."""

    def find(self, question: str, sentence: str) -> ShortSpan | None: ...


@dataclass(frozen=True, slots=True)
class SpanConfig:
    # The span head's file (None: the package's).
    path: Path | None = None
    device: str = "auto"
    # As the sentence reader's (`ReaderConfig`): ONNX Runtime in int8 on the CPU, else torch.
    runtime: str = "auto"
    dtype: str = "auto"
    cache_dir: Path = Path.home() / ".cache" / "answer-service"


class SpanReader:
    """Finds the short answer in a sentence; cheap to build, loads in `warm_up()`. Blocking:
    callers run it in their stage's thread pool."""

    def __init__(self, config: SpanConfig, embedder_model: str = DEFAULT_EMBEDDER) -> None:
        self._config = config
        self._embedder_model = embedder_model
        self._model: Any = None
        self._tokenizer: Any = None
        self._meta: SpanMeta | None = None
        self._device = "cpu"
        self._lock = threading.Lock()

    @property
    def meta(self) -> SpanMeta:
        if self._meta is None:
            self.warm_up()
        assert self._meta is not None
        return self._meta

    def warm_up(self) -> None:
        if self._model is not None:
            return
        from retrieval.sentences.span_model import SpanModel

        meta, arrays = read_span_file(self._config.path)
        if meta.base != self._embedder_model:
            raise RetrievalError(
                f"the span head adapts {meta.base!r}, the embedder is {self._embedder_model!r}"
            )
        self._device = pick_device(self._config.device)
        base_dir = resolve_model_path(meta.base)
        runtime = pick_runtime(self._config.runtime, self._device, base_dir)
        dtype = pick_dtype(self._config.dtype, self._device, runtime)
        scale = meta.alpha / max(meta.rank, 1)
        try:
            if runtime == "onnx":
                from transformers import AutoTokenizer

                from retrieval.sentences.reader_adapter import adapted_session

                session = adapted_session(
                    Path(base_dir), scale, arrays, dtype, self._config.cache_dir
                )
                self._model = _OnnxSpans(session, arrays)
                self._tokenizer = AutoTokenizer.from_pretrained(base_dir)
            else:
                model, self._tokenizer = SpanModel.merged(base_dir, scale, arrays)
                self._model = model.to(self._device).eval()
        except (OSError, ValueError, KeyError) as exc:
            raise RetrievalError(f"cannot load the span head: {exc}") from exc
        self._meta = meta
        self.spans("warm-up question?", ["A warm-up sentence."])
        logger.info(
            "span head loaded base=%s device=%s runtime=%s dtype=%s",
            meta.base,
            self._device,
            runtime,
            dtype,
        )

    def find(self, question: str, sentence: str) -> ShortSpan | None:
        """The short answer in `sentence`, where the head is sure enough of one."""
        found = self.spans(question, [sentence])[0]
        if found is None or found.score < self.meta.threshold:
            return None
        return found

    def spans(self, question: str, sentences: Sequence[str]) -> list[ShortSpan | None]:
        """The best span of each sentence, whatever its score."""
        if not sentences:
            return []
        meta = self.meta
        onnx = isinstance(self._model, _OnnxSpans)
        with self._lock:
            encoded = self._tokenizer(
                [question] * len(sentences),
                list(sentences),
                truncation="only_second",
                max_length=meta.max_tokens,
                padding=True,
                return_offsets_mapping=True,
                return_tensors="np" if onnx else "pt",
            )
            offsets = encoded.pop("offset_mapping").tolist()
            starts_np, ends_np = self._logits(encoded, onnx)
        out: list[ShortSpan | None] = []
        for row, sentence in enumerate(sentences):
            ids = encoded.sequence_ids(row)
            in_sentence = np.asarray([i == 1 for i in ids], dtype=bool)
            picked = best_span(starts_np[row], ends_np[row], in_sentence, meta.max_answer_tokens)
            if picked is None:
                out.append(None)
                continue
            first, last, score = picked
            start, end = whole_words(sentence, *char_span(offsets[row], first, last))
            out.append(ShortSpan(sentence[start:end], start, end, score))
        return out

    def _logits(self, encoded: Any, onnx: bool) -> tuple[npt.NDArray[Any], npt.NDArray[Any]]:
        if onnx:
            return self._model.logits(encoded)  # type: ignore[no-any-return]
        import torch

        with torch.inference_mode():
            starts, ends = self._model(**encoded.to(self._device))
        return (
            starts.float().cpu().numpy().astype(np.float64),
            ends.float().cpu().numpy().astype(np.float64),
        )


class _OnnxSpans:
    """The span head under ONNX Runtime (`adapted_session`): the head's start and end logits
    over the token states in numpy."""

    def __init__(self, session: Any, arrays: dict[str, npt.NDArray[Any]]) -> None:
        self._session = session
        self._weight = np.asarray(arrays["head/weight"], dtype=np.float32)
        self._bias = np.asarray(arrays["head/bias"], dtype=np.float32)

    def logits(self, encoded: Any) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        from retrieval.onnx_encoder import run_states

        both = (run_states(self._session, encoded) @ self._weight.T + self._bias).astype(np.float64)
        return both[..., 0], both[..., 1]


def with_threshold(meta: SpanMeta, threshold: float) -> SpanMeta:
    return replace(meta, threshold=threshold)
