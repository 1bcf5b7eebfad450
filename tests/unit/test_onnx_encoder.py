"""Which models the embedder runs under ONNX Runtime (retrieval/embedder.py `pick_runtime`,
retrieval/onnx_encoder.py `mean_pooled`), and the exported files' cache: written aside and
renamed, named by the weights they came from, removed once long unused."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from retrieval.embedder import pick_dtype, pick_runtime, resolve_model_path
from retrieval.onnx_encoder import (
    UNUSED_EXPORT_S,
    _digest,
    _written,
    forget_unused_exports,
    mean_pooled,
)


def _folder(tmp_path: Path, pooling: dict[str, bool], kinds: tuple[str, ...]) -> Path:
    folder = tmp_path / "model"
    (folder / "1_Pooling").mkdir(parents=True)
    modules = [
        {
            "idx": n,
            "name": str(n),
            "path": "1_Pooling" if kind == "Pooling" else "",
            "type": f"sentence_transformers.models.{kind}",
        }
        for n, kind in enumerate(kinds)
    ]
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"weights")
    return folder


MEAN = {"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": False}


def test_a_mean_pooled_transformer_is_recognised(tmp_path: Path) -> None:
    assert mean_pooled(_folder(tmp_path, MEAN, ("Transformer", "Pooling", "Normalize")))


@pytest.mark.parametrize(
    ("pooling", "kinds"),
    [
        (
            {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False},
            ("Transformer", "Pooling", "Normalize"),
        ),
        (MEAN, ("Transformer", "Pooling", "Dense", "Normalize")),
        (MEAN, ("Transformer",)),
    ],
)
def test_other_pipelines_stay_on_torch(
    tmp_path: Path, pooling: dict[str, bool], kinds: tuple[str, ...]
) -> None:
    folder = _folder(tmp_path, pooling, kinds)
    assert not mean_pooled(folder)
    assert pick_runtime("auto", "cpu", str(folder)) == "torch"


def test_the_runtime_follows_the_device_and_the_model(tmp_path: Path) -> None:
    packaged = resolve_model_path("sentence-transformers/all-MiniLM-L6-v2")
    assert pick_runtime("auto", "cpu", packaged) == "onnx"
    assert pick_runtime("auto", "cuda:0", packaged) == "torch"
    assert pick_runtime("auto", "cpu", "some-org/a-hub-model") == "torch"  # not a local folder
    assert pick_runtime("torch", "cpu", packaged) == "torch"
    assert pick_dtype("auto", "cpu", "onnx") == "int8"
    assert pick_dtype("float32", "cpu", "onnx") == "float32"


def test_the_export_is_named_by_its_weights(tmp_path: Path) -> None:
    folder = _folder(tmp_path, MEAN, ("Transformer", "Pooling"))
    before = _digest(folder)
    assert _digest(folder) == before
    (folder / "model.safetensors").write_bytes(b"other weights")
    assert _digest(folder) != before


def test_a_file_is_written_aside_then_renamed_and_kept(tmp_path: Path) -> None:
    target = tmp_path / "onnx" / "model.onnx"
    calls: list[Path] = []

    def write(path: Path) -> None:
        calls.append(path)
        assert path != target
        assert path.parent == target.parent
        path.write_bytes(b"graph")

    assert _written(target, write) == target
    assert target.read_bytes() == b"graph"
    assert _written(target, write) == target  # kept: not written again
    assert len(calls) == 1

    def fails(path: Path) -> None:
        path.write_bytes(b"half")
        raise OSError("disk full")

    other = tmp_path / "onnx" / "model.int8.onnx"
    with pytest.raises(OSError, match="disk full"):
        _written(other, fails)
    assert list(other.parent.iterdir()) == [target]  # nothing half-written left behind


def test_exports_no_process_opened_for_a_while_are_removed(tmp_path: Path) -> None:
    """Each retrained reader or new version makes an export (~110 MB): one unopened for longer
    than the bound goes when a new one is made; one opened lately (its `.used` touched) stays,
    however old its files, and so does one without a mark that is itself recent."""
    root = tmp_path / "onnx"
    stale, reopened, fresh = (root / name for name in ("stale", "reopened", "fresh"))
    for folder in (stale, reopened, fresh):
        folder.mkdir(parents=True)
        (folder / "model.onnx").write_bytes(b"x")
    week_ago = time.time() - 8 * 24 * 3600
    for folder in (stale, reopened):
        (folder / ".used").touch()
        os.utime(folder / ".used", (week_ago, week_ago))
        os.utime(folder, (week_ago, week_ago))
    (reopened / ".used").touch()  # opened now
    removed = forget_unused_exports(root, UNUSED_EXPORT_S)
    assert removed == [stale]
    assert not stale.exists()
    assert (reopened / "model.onnx").is_file()
    assert (fresh / "model.onnx").is_file()
