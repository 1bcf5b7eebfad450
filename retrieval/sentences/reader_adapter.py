"""The sentence reader's adapter file, how it was trained, and merging it into its base encoder
(reader.py and span.py serve it under ONNX Runtime through `adapted_session`, reader_model.py
builds the torch model from it; all import this, so none imports another at load time).

The adapter file: `lora/<module>/a` (rank x in) and `lora/<module>/b` (out x rank) per adapted
linear layer, `norm/<module>/weight|bias` per layer norm, `head/weight|bias`, and `meta` (a JSON
string: rank, alpha, the base model, max_tokens, whether the passage title is read).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from retrieval.embedder import DEFAULT_EMBEDDER
from retrieval.errors import RetrievalError

# The linear layers of a BERT layer that carry adapters (names under `encoder.layer.<i>.`).
TARGETS = (
    "attention.self.query",
    "attention.self.key",
    "attention.self.value",
    "attention.output.dense",
    "intermediate.dense",
    "output.dense",
)
ADAPTER_FILE = "reader.npz"


@dataclass(frozen=True, slots=True)
class ReaderMeta:
    """How an adapter was trained, which is how it must be read."""

    base: str = DEFAULT_EMBEDDER
    rank: int = 16
    alpha: float = 32.0
    max_tokens: int = 128
    with_title: bool = False
    # The builtin reranker's: how much a candidate's retrieval rank counts against the model's
    # score (score - rank_prior x ln(1 + rank)); chosen on development queries by its trainer.
    rank_prior: float = 0.0

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ReaderMeta:
        raw = json.loads(text)
        # A field added later (rank_prior) takes its default in a file written before it.
        fields = [f for f in dataclasses.fields(cls) if f.name in raw or f.name != "rank_prior"]
        return cls(**{field.name: raw[field.name] for field in fields})


def pair_text(text: str, title: str, with_title: bool) -> str:
    """The second half of a pair: the sentence (line wraps as spaces), after its passage's title
    where the adapter was trained so."""
    sentence = " ".join(text.split())
    return f"{title}: {sentence}" if with_title and title else sentence


def read_weights(
    path: Path | None, shipped_name: str, what: str
) -> tuple[str, dict[str, npt.NDArray[Any]]]:
    """The metadata (JSON) and arrays of an adapter file (the reader's, the span head's) in
    `path`, or of the one shipped with the package as `shipped_name`."""
    try:
        if path is None:
            with resources.as_file(
                resources.files("retrieval.sentences").joinpath(shipped_name)
            ) as shipped:
                return read_weights(shipped, shipped_name, what)
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: np.asarray(data[k]) for k in data.files}
        return str(arrays.pop("meta")), arrays
    except (OSError, ValueError, KeyError) as exc:
        raise RetrievalError(f"cannot read {what}: {exc}") from exc


def write_weights(path: Path, meta_json: str, arrays: dict[str, npt.NDArray[Any]]) -> None:
    """An adapter file: its arrays in float16, beside its metadata."""
    half: dict[str, Any] = {k: np.asarray(v, dtype=np.float16) for k, v in arrays.items()}
    np.savez_compressed(path, meta=np.asarray(meta_json), **half)


def read_adapter(path: Path | None = None) -> tuple[ReaderMeta, dict[str, npt.NDArray[Any]]]:
    """The adapter in `path`, or the one shipped with the package."""
    meta, arrays = read_weights(path, ADAPTER_FILE, "the sentence reader's adapter")
    try:
        return ReaderMeta.from_json(meta), arrays
    except (ValueError, KeyError) as exc:
        raise RetrievalError(f"cannot read the sentence reader's adapter: {exc}") from exc


def write_adapter(path: Path, meta: ReaderMeta, arrays: dict[str, npt.NDArray[Any]]) -> None:
    write_weights(path, meta.to_json(), arrays)


def merge_adapters(encoder: Any, scale: float, arrays: dict[str, npt.NDArray[Any]]) -> set[str]:
    """Add each adapter of `arrays` into its base weight (W + scale B A) of a plain `encoder`
    and copy its layer norms in; the names used."""
    import torch

    modules = dict(encoder.named_modules())
    used: set[str] = set()
    with torch.no_grad():
        for key in arrays:
            kind, _, rest = key.partition("/")
            name, _, part = rest.rpartition("/")
            if kind == "lora" and part == "a":
                a = torch.from_numpy(np.asarray(arrays[key], np.float32))
                b = torch.from_numpy(np.asarray(arrays[f"lora/{name}/b"], np.float32))
                modules[name].weight += scale * (b @ a)
                used |= {key, f"lora/{name}/b"}
            elif kind == "norm":
                getattr(modules[name], part).copy_(
                    torch.from_numpy(np.asarray(arrays[key], np.float32))
                )
                used.add(key)
    return used


def adapted_session(
    base_dir: Path,
    scale: float,
    arrays: dict[str, npt.NDArray[Any]],
    precision: str,
    cache_dir: Path,
) -> Any:
    """A CPU session of `base_dir`'s encoder with the low-rank adapters and layer norms of
    `arrays` merged in (`merge_adapters`): the sentence reader's and the span head's.
    `precision`: float32 or int8 (else ValueError). Exported once per adapter (its files named
    by a digest of the arrays), then read from `cache_dir`."""
    from retrieval.onnx_encoder import cpu_session, exported_model

    if precision not in ("float32", "int8"):
        raise ValueError(f"dtype {precision!r} does not run under ONNX Runtime")
    encoder = {key: value for key, value in arrays.items() if not key.startswith("head/")}
    digest = hashlib.sha256(f"{scale}".encode())
    for key in sorted(encoder):
        digest.update(key.encode())
        digest.update(np.ascontiguousarray(encoder[key], dtype=np.float32).tobytes())
    model_file = exported_model(
        base_dir,
        cache_dir,
        precision,  # type: ignore[arg-type]
        change=lambda model: merge_adapters(model, scale, encoder),
        change_digest=digest.hexdigest()[:16],
    )
    return cpu_session(model_file)
