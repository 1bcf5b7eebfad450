"""The real MiniLM embedder's sentence vectors pooled from a passage's own pass ("late
chunking"): the passage's vector is the one `encode` gives, each sentence's vector is near what
the sentence alone embeds to and nearer its own question than the other sentences are, and a
sentence past the model's window is embedded on its own."""

from __future__ import annotations

import numpy as np
import pytest

from retrieval.embedder import EmbedderConfig, SentenceTransformerEmbedder

pytestmark = pytest.mark.integration

_PASSAGE = (
    "Routine Vacuuming\n"
    "VACUUM reclaims the storage occupied by dead tuples. "
    "The default port of the server is 5432, set by the port parameter. "
    "A base backup can be taken with pg_basebackup while the server runs."
)


def _spans(text: str, sentences: list[str]) -> list[tuple[int, int]]:
    return [(text.index(s), text.index(s) + len(s)) for s in sentences]


def test_sentence_vectors_come_from_the_passage_pass() -> None:
    embedder = SentenceTransformerEmbedder(EmbedderConfig(device="cpu"))
    sentences = [
        "VACUUM reclaims the storage occupied by dead tuples.",
        "The default port of the server is 5432, set by the port parameter.",
        "A base backup can be taken with pg_basebackup while the server runs.",
    ]
    vectors, pooled = embedder.encode_with_spans([_PASSAGE], [_spans(_PASSAGE, sentences)])
    assert float(vectors[0] @ embedder.encode([_PASSAGE])[0]) > 0.9999
    rows = pooled[0]
    assert rows.shape == (3, embedder.dimension)
    assert np.allclose(np.linalg.norm(rows, axis=1), 1.0, atol=1e-5)
    alone = embedder.encode(sentences)
    # Each pooled sentence is nearest its own text among the three.
    assert list(np.argmax(rows @ alone.T, axis=1)) == [0, 1, 2]
    questions = embedder.encode(
        ["How is the space of dead rows reclaimed?", "Which port does it listen on?"]
    )
    assert list(np.argmax(questions @ rows.T, axis=1)) == [0, 1]


def test_a_sentence_past_the_window_is_embedded_alone() -> None:
    embedder = SentenceTransformerEmbedder(EmbedderConfig(device="cpu", max_seq_length=32))
    filler = " ".join(["padding words fill the window"] * 12) + ". "
    last = "The checkpoint timeout defaults to five minutes."
    text = filler + last
    _, pooled = embedder.encode_with_spans([text], [_spans(text, [last])])
    assert float(pooled[0][0] @ embedder.encode([last])[0]) > 0.999
