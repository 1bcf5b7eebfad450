"""A sentence-transformers bi-encoder's transformer run by ONNX Runtime on the CPU.

The weights are the model folder's own: exported once with `torch.onnx` and, for `int8`,
quantized dynamically per output channel with ONNX Runtime's own tool (weights int8, activations
quantized as they come). Both files are kept under the cache folder, named by a digest of the
weights, the config, the versions that made them and `EXPORT_FORMAT`, so a changed model or
exporter makes new ones; a file is written aside and renamed, so processes that export at once
never read half of one. Each opening marks its folder used; making a new export removes the
folders none opened for `UNUSED_EXPORT_S` (a week). Only the pipelines the service knows how to finish are run here:
a transformer, mean pooling, optionally a normalisation (what `mean_pooled` checks); any other
stays on sentence-transformers' torch path. The sentence reader's encoder, its adapters merged
in, is exported the same way (`exported_model(change=...)`) and run by `cpu_session`.

Why ONNX Runtime: int8 per channel ran the build's passage pass in 0.68x torch's CPU time and
a question's embedding in 0.38x its time on these AVX2 CPUs, vectors at cosine 0.993 (median)
to torch's and quotes as good (docs/benchmarks/embedder-runtimes.json); at float32 it was no
faster than torch's own attention kernels.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from retrieval.errors import RetrievalError

logger = logging.getLogger(__name__)

# Raised when what the export writes changes (inputs, opset, quantization options).
EXPORT_FORMAT = 1
_OPSET = 17
_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")

# An export folder no process has opened for this long is removed when a new export is made
# (a retrained reader, a new model or library version each make one; about 110 MB apiece).
UNUSED_EXPORT_S = 7 * 24 * 3600
_USED = ".used"

Precision = Literal["float32", "int8"]
Floats = npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class TokenStates:
    """One text's pass: its mean-pooled vector (not normalised), its token states and each
    token's character offsets in the text (special tokens are (0, 0))."""

    vector: Floats
    states: Floats
    offsets: npt.NDArray[np.int64]


def mean_pooled(model_path: Path) -> bool:
    """Whether the sentence-transformers folder is a transformer, mean pooling and at most a
    normalisation: the pipeline `OnnxEncoder` reproduces."""
    try:
        modules = json.loads((model_path / "modules.json").read_text())
        kinds = [module["type"].rsplit(".", 1)[-1] for module in modules]
        pooling = next(m for m in modules if m["type"].endswith("Pooling"))
        config = json.loads((model_path / pooling["path"] / "config.json").read_text())
    except (OSError, ValueError, KeyError, StopIteration):
        return False
    modes = {key for key, on in config.items() if key.startswith("pooling_mode") and on is True}
    return kinds in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]) and (
        modes == {"pooling_mode_mean_tokens"}
    )


def _digest(model_path: Path) -> str:
    import onnxruntime
    import torch

    digest = hashlib.sha256(
        f"{EXPORT_FORMAT}:{torch.__version__}:{onnxruntime.__version__}".encode()
    )
    digest.update((model_path / "config.json").read_bytes())
    weights = next(
        (model_path / name for name in _WEIGHT_FILES if (model_path / name).is_file()), None
    )
    if weights is None:
        raise RetrievalError(f"no weights file ({', '.join(_WEIGHT_FILES)}) in {model_path}")
    with weights.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def _export(model_path: Path, target: Path, change: Callable[[Any], object] | None) -> None:
    import torch
    from transformers import AutoModel, AutoTokenizer

    # Eager attention: the exported graph then masks padding from the inputs, for any shape.
    model = AutoModel.from_pretrained(model_path, attn_implementation="eager").eval()
    if change is not None:
        change(model)
    sample = AutoTokenizer.from_pretrained(model_path)(
        ["a short text", "a somewhat longer text to export with"], padding=True, return_tensors="pt"
    )

    class _States(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
            states: torch.Tensor = self.model(
                **dict(zip(_INPUTS, inputs, strict=True))
            ).last_hidden_state
            return states

    axes = {name: {0: "batch", 1: "tokens"} for name in (*_INPUTS, "states")}
    # The tracer warns of every Python branch on a shape; the axes above keep them dynamic.
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            _States(),
            tuple(sample[name] for name in _INPUTS),
            str(target),
            input_names=list(_INPUTS),
            output_names=["states"],
            dynamic_axes=axes,
            opset_version=_OPSET,
            dynamo=False,
        )


def _written(target: Path, write: Any) -> Path:
    """`target`, made by `write(path)` into a file beside it and renamed, unless it exists."""
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    aside = target.with_name(f".{target.name}.{os.getpid()}")
    try:
        write(aside)
        os.replace(aside, target)
    finally:
        aside.unlink(missing_ok=True)
    return target


def exported_model(
    model_path: Path,
    cache_dir: Path,
    precision: Precision,
    *,
    change: Callable[[Any], object] | None = None,
    change_digest: str = "",
) -> Path:
    """The ONNX file of `model_path`'s transformer at `precision`, exported (and quantized) on
    first use and kept under `cache_dir`. `change`: done to the loaded model before it is
    exported (the sentence reader merges its adapters), its files told apart by
    `change_digest` (a digest of what it changes)."""
    name = f"{model_path.name}-{_digest(model_path)}"
    folder = cache_dir / "onnx" / (f"{name}-{change_digest}" if change_digest else name)
    new = not (folder / "model.onnx").is_file()
    plain = _written(folder / "model.onnx", lambda path: _export(model_path, path, change))
    (folder / _USED).touch()
    if new:
        forget_unused_exports(folder.parent, UNUSED_EXPORT_S)
    if precision == "float32":
        return plain

    def quantize(path: Path) -> None:
        from onnxruntime.quantization import QuantType, quantize_dynamic

        # The quantizer logs a line per tensor through the root logger (`logging.info`); only
        # records logged there directly are dropped, not other loggers' that reach its handlers.
        quiet = _BelowError()
        logging.getLogger().addFilter(quiet)
        try:
            # Per output channel, in 7 bits: on CPUs without VNNI, 8-bit products can saturate.
            quantize_dynamic(
                plain, path, weight_type=QuantType.QInt8, per_channel=True, reduce_range=True
            )
        finally:
            logging.getLogger().removeFilter(quiet)

    return _written(folder / "model.int8.onnx", quantize)


def forget_unused_exports(root: Path, unused_s: float) -> list[Path]:
    """Remove the export folders under `root` that no process has opened for `unused_s` (each
    opening touches its `.used`; a folder without one counts from its own time); return them.
    A process that has a session open keeps it: the session holds the model in memory."""
    cutoff = time.time() - unused_s
    removed = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        mark = folder / _USED
        try:
            last = (mark if mark.exists() else folder).stat().st_mtime
        except FileNotFoundError:  # another process removed it first
            continue
        if last < cutoff:
            shutil.rmtree(folder, ignore_errors=True)
            logger.info("onnx export removed, unused for %.0f days: %s", unused_s / 86400, folder)
            removed.append(folder)
    return removed


class _BelowError(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR


def cpu_session(model_file: Path) -> Any:
    """An ONNX Runtime session of `model_file` on the CPU, for one call at a time (its caller
    holds a lock): threads that spin between calls would take a core from SGLang on a small
    machine."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    try:
        return ort.InferenceSession(str(model_file), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own untyped errors on a bad file
        raise RetrievalError(f"cannot load {model_file}: {exc}") from exc


class OnnxEncoder:
    """Token states and mean-pooled vectors of texts, in batches sorted by length (least
    padding), returned in the order the texts came."""

    def __init__(
        self, model_file: Path, tokenizer: Any, *, max_seq_length: int, pad_to_multiple_of: int
    ) -> None:
        self._session = cpu_session(model_file)
        self._tokenizer = tokenizer
        self._pad_id = int(tokenizer.pad_token_id or 0)
        self._max_seq_length = max_seq_length
        self._multiple = pad_to_multiple_of if pad_to_multiple_of > 1 else None

    def token_states(
        self, texts: Sequence[str], *, batch_size: int
    ) -> Iterator[tuple[int, TokenStates]]:
        """Each text's number and pass, a batch at a time (so a caller that keeps only what it
        pools from the states holds one batch's): the texts tokenized once, then batched by
        their token counts, longest first, each batch padded to its longest (up to a multiple of
        `pad_to_multiple_of`). On the manual's passages in calls of 1,024 that is 1.08x their
        real tokens, where sorting by characters gave 1.25x (docs/documents.md)."""
        encoded = self._tokenizer(
            list(texts),
            truncation=True,
            max_length=self._max_seq_length,
            return_offsets_mapping=True,
            return_token_type_ids=True,
        )
        lengths = [len(ids) for ids in encoded["input_ids"]]
        order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
        for at in range(0, len(order), batch_size):
            chosen = order[at : at + batch_size]
            width = max(lengths[i] for i in chosen)
            if self._multiple is not None:
                width = min(-(-width // self._multiple) * self._multiple, self._max_seq_length)
            feed = {name: np.zeros((len(chosen), width), dtype=np.int64) for name in _INPUTS}
            feed["input_ids"][:] = self._pad_id
            for row, number in enumerate(chosen):
                size = lengths[number]
                feed["input_ids"][row, :size] = encoded["input_ids"][number]
                feed["attention_mask"][row, :size] = 1
                feed["token_type_ids"][row, :size] = encoded["token_type_ids"][number]
            states = self._session.run(None, feed)[0]
            for row, number in enumerate(chosen):
                kept = states[row, : lengths[number]]
                offsets = np.asarray(encoded["offset_mapping"][number], dtype=np.int64)
                yield number, TokenStates(kept.mean(axis=0), kept, offsets.reshape(-1, 2))


def run_states(session: Any, encoded: Any) -> Floats:
    """The token states of a tokenizer's numpy batch (pairs carry their token types)."""
    feed = {name: np.asarray(encoded[name], dtype=np.int64) for name in _INPUTS}
    states: Floats = session.run(None, feed)[0]
    return states
