"""The `Embedder` contract (retrieval/embedder.py), for the packaged MiniLM under ONNX Runtime
(the CPU's default) and under torch, and for the fake."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np
import pytest

from retrieval.embedder import Embedder, EmbedderConfig, SentenceTransformerEmbedder
from tests.fakes.hash_embedder import HashEmbedder

TEXTS = ["How long is green tea steeped?", "Mount Etna is on Sicily.", "a"]


@pytest.fixture(scope="module", params=["onnx", "torch", "hash"])
def embedder(request: pytest.FixtureRequest) -> Iterator[Embedder]:
    made: Embedder = (
        HashEmbedder()
        if request.param == "hash"
        else SentenceTransformerEmbedder(EmbedderConfig(device="cpu", runtime=request.param))
    )
    made.warm_up()
    return made


def test_vectors_are_float32_unit_rows_of_its_dimension(embedder: Embedder) -> None:
    vectors = embedder.encode(TEXTS)
    assert vectors.dtype == np.float32
    assert vectors.shape == (len(TEXTS), embedder.dimension)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-3)


def test_a_text_gets_the_same_vector_alone_and_in_a_batch(embedder: Embedder) -> None:
    batch = embedder.encode(TEXTS, batch_size=2)
    alone = np.vstack([embedder.encode([text]) for text in TEXTS])
    assert np.allclose(batch, alone, atol=2e-2)


def test_similar_texts_are_closer_than_unrelated_ones(embedder: Embedder) -> None:
    query, near, far = embedder.encode(
        ["green tea steeping time", "How long is green tea steeped?", "The Danube flows east."]
    )
    assert float(query @ near) > float(query @ far)


def test_token_spans_are_ordered_slices_of_the_text(embedder: Embedder) -> None:
    text = "Green tea, steeped: two minutes."
    spans = embedder.token_spans(text)
    assert spans
    assert all(0 <= start < end <= len(text) for start, end in spans)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))
    assert embedder.token_spans("") == []


def test_it_names_itself(embedder: Embedder) -> None:
    assert isinstance(embedder.name, str)
    assert embedder.name
