"""Contract suites: each protocol's behaviour written once and run against the real
implementation and the in-repo fake alike. The real servers and models come from the
integration fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

from retrieval.embedder import DEFAULT_EMBEDDER, resolve_model_path
from tests.integration.conftest import smollm2_dir, tiny_sglang

__all__ = ["smollm2_dir", "tiny_sglang"]


@pytest.fixture(scope="session")
def fresh_cross_encoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cross-encoder of the real shape and cost: the packaged MiniLM encoder with a fresh
    classification head (no cross-encoder weights can be had offline)."""
    from sentence_transformers import CrossEncoder

    target = tmp_path_factory.mktemp("cross-encoder")
    CrossEncoder(resolve_model_path(DEFAULT_EMBEDDER), num_labels=1, device="cpu").save(str(target))
    return target
