"""The sentences of an index's passages, with their vectors, built once with the index.

Layout (`<index dir>/sentences/`): `spans.npy` (int32, one row per sentence: passage row, start
and end in the passage's text, its place in the passage, flags), `offsets.npy` (int64: the
sentences of passage row r are `offsets[r]:offsets[r + 1]`), `vectors.npy` (float16, a unit
vector per sentence; zero for code blocks and headings, which are never quoted) and
`terms.json` (document frequencies of the passages' content terms, for IDF weights).

A sentence's vector comes from its passage's own pass through the embedder (`embed_passages`):
the mean of the token states the sentence covers, read in the passage's context ("late
chunking"), so sentences cost no second pass. A sentence in the overlap of two windows is
stored with each, with each window's vector.

A window that starts or ends inside a sentence holds a fragment of it; the flags say so, and
say which spans are code blocks or list items (retrieval/sentences/splitter.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from retrieval.embedder import Embedder, Vectors, passage_embedding_text
from retrieval.errors import IndexMismatchError
from retrieval.passage import Passage
from retrieval.sentences.splitter import SpanKind, split_sentences
from retrieval.sentences.terms import Idf

SENTENCES_DIR = "sentences"
WHOLE, CODE, ITEM = 1, 2, 4
_MIN_EMBEDDED_WORDS = 3
_ENDS = (".", "!", "?", ":", '"', "'", ")", "\u201d")
# Passages are handed to `embed_passages` this many batches at a time: the encoder sorts one
# call's texts by length before it batches them, so one call of many batches pads less than
# many calls of one. On the manual's 11,870 passages, sorted by their token counts (ONNX
# Runtime's path), batches of 64 padded to 16: 1.17x their real tokens in calls of 4 batches,
# 1.08x in calls of 16 (sorted by characters, as sentence-transformers does: 1.26x, 1.25x).
SORTED_BATCHES = 16


@dataclass(frozen=True, slots=True)
class SentenceRef:
    sentence_id: int
    row: int
    start: int
    end: int
    # Its place among its passage's sentences (0: the first).
    position: int
    whole: bool
    kind: SpanKind


class SentenceStore:
    def __init__(
        self,
        spans: npt.NDArray[np.int32],
        offsets: npt.NDArray[np.int64],
        vectors: npt.NDArray[np.float16],
        idf: Idf,
    ) -> None:
        if spans.shape[0] != vectors.shape[0] or offsets[-1] != spans.shape[0]:
            raise IndexMismatchError("the sentence spans, offsets and vectors do not agree")
        self.spans = spans
        self.offsets = offsets
        self.vectors = vectors
        self.idf = idf

    def __len__(self) -> int:
        return int(self.spans.shape[0])

    @property
    def passages(self) -> int:
        return int(self.offsets.shape[0] - 1)

    def of(self, row: int) -> list[SentenceRef]:
        """The sentences of passage row `row`, in order."""
        first, last = int(self.offsets[row]), int(self.offsets[row + 1])
        return [self.ref(i) for i in range(first, last)]

    def ref(self, sentence_id: int) -> SentenceRef:
        row, start, end, position, flags = (int(v) for v in self.spans[sentence_id])
        kind: SpanKind = "code" if flags & CODE else ("item" if flags & ITEM else "prose")
        return SentenceRef(sentence_id, row, start, end, position, bool(flags & WHOLE), kind)

    @classmethod
    def build(cls, passages: Sequence[Passage], vectors: npt.NDArray[np.float16]) -> SentenceStore:
        """Split every passage; `vectors`: one row per sentence, in order, as
        `embed_passages` gave them with the passages' own vectors."""
        spans: list[tuple[int, int, int, int, int]] = []
        offsets = [0]
        for row, passage in enumerate(passages):
            first_window = row == 0 or section_break(passages[row - 1], passage)
            last_window = row + 1 == len(passages) or section_break(passage, passages[row + 1])
            for position, (start, end, flags) in enumerate(
                _spans(passage, first_window, last_window)
            ):
                spans.append((row, start, end, position, flags))
            offsets.append(len(spans))
        if vectors.shape[0] != len(spans):
            raise IndexMismatchError(
                f"{vectors.shape[0]} sentence vectors for the passages' {len(spans)} sentences"
            )
        return cls(
            np.asarray(spans, dtype=np.int32).reshape(-1, 5),
            np.asarray(offsets, dtype=np.int64),
            np.asarray(vectors, dtype=np.float16),
            Idf.count(f"{p.title}\n{p.text}" for p in passages),
        )

    def save(self, directory: Path) -> None:
        target = directory / SENTENCES_DIR
        target.mkdir(parents=True, exist_ok=True)
        np.save(target / "spans.npy", self.spans)
        np.save(target / "offsets.npy", self.offsets)
        np.save(target / "vectors.npy", self.vectors)
        terms = {"documents": self.idf.documents, "frequencies": self.idf.frequencies}
        (target / "terms.json").write_text(json.dumps(terms), encoding="utf-8")

    @classmethod
    def load(cls, directory: Path, passage_count: int, dimension: int) -> SentenceStore:
        source = directory / SENTENCES_DIR
        try:
            terms = json.loads((source / "terms.json").read_text(encoding="utf-8"))
            store = cls(
                np.load(source / "spans.npy"),
                np.load(source / "offsets.npy"),
                np.load(source / "vectors.npy", mmap_mode="r"),
                Idf(int(terms["documents"]), terms["frequencies"]),
            )
        except (OSError, ValueError, KeyError) as exc:
            raise IndexMismatchError(f"cannot read the sentences of {directory}: {exc}") from exc
        if store.passages != passage_count or store.vectors.shape[1] != dimension:
            raise IndexMismatchError(
                f"the sentences of {directory} are for {store.passages} passages of dimension "
                f"{store.vectors.shape[1]}, the index has {passage_count} of {dimension}"
            )
        return store


@dataclass(frozen=True, slots=True)
class EmbeddedPassages:
    """Passages' vectors and their sentences': `sentence_counts[i]` rows of
    `sentence_vectors`, in order, are passage i's, as `SentenceStore.build` lays them out."""

    vectors: Vectors
    sentence_vectors: npt.NDArray[np.float16]
    sentence_counts: tuple[int, ...]


def embed_passages(
    passages: Sequence[Passage], embedder: Embedder, *, batch_size: int = 64
) -> EmbeddedPassages:
    """The passages' vectors and, from the same pass, their sentences'. Code blocks, headings
    and other units under 3 words are never quoted: their row is zero. Blocking."""
    texts: list[str] = []
    counts: list[int] = []
    wanted: list[list[tuple[int, int]]] = []
    rows: list[int] = []  # for each sentence, its row among the wanted ones, or -1
    count = 0
    for passage in passages:
        text = passage_embedding_text(passage)
        # The passage's text ends what is embedded (after its heading path).
        shift = len(text) - len(passage.text)
        spans: list[tuple[int, int]] = []
        found = split_sentences(passage.text)
        counts.append(len(found))
        for span in found:
            words = passage.text[span.start : span.end].split()
            if span.kind == "code" or len(words) < _MIN_EMBEDDED_WORDS:
                rows.append(-1)
                continue
            rows.append(count)
            count += 1
            spans.append((span.start + shift, span.end + shift))
        texts.append(text)
        wanted.append(spans)
    vectors, pooled = embedder.encode_with_spans(texts, wanted, batch_size=batch_size)
    blocks = [block for block in pooled if block.shape[0]]
    every = np.vstack(blocks) if blocks else np.zeros((0, vectors.shape[1]), dtype=np.float32)
    index = np.asarray(rows, dtype=np.int64)
    sentences = np.zeros((len(rows), vectors.shape[1]), dtype=np.float16)
    sentences[index >= 0] = every[index[index >= 0]].astype(np.float16)
    return EmbeddedPassages(vectors, sentences, tuple(counts))


def section_break(before: Passage, after: Passage) -> bool:
    """Whether window `after` starts a section (or a document) that window `before` is not in.
    Windows inside a section overlap; one that starts where the other has ended, under other
    headings, starts the next section, and so neither cuts a sentence there. A JSONL document
    is one section."""
    return after.doc_id != before.doc_id or (
        before.end_char <= after.start_char
        and (before.heading_path, before.anchor) != (after.heading_path, after.anchor)
    )


def starts_cut(passage: Passage, start: int, position: int) -> bool:
    """Whether the unit at `start`, the `position`th of the window, is a sentence the window
    starts inside (a window after a document's first starts wherever it fell)."""
    return position == 0 and passage.position > 0 and not passage.text[start].isupper()


def ends_cut(passage: Passage, end: int, position: int, count: int) -> bool:
    """Whether the unit ending at `end`, the `position`th of the window's `count`, is a
    sentence the window ends inside (the document's last window ends with it)."""
    return position == count - 1 and not passage.text[:end].endswith(_ENDS)


def _spans(
    passage: Passage, first_window: bool, last_window: bool
) -> Iterator[tuple[int, int, int]]:
    """The window's units as (start, end, flags); a section's first window starts with a whole
    unit and its last ends with one, since a window never crosses a section's edge."""
    text = passage.text
    found = split_sentences(text)
    for n, span in enumerate(found):
        whole = (first_window or not starts_cut(passage, span.start, n)) and (
            last_window or not ends_cut(passage, span.end, n, len(found))
        )
        flags = (WHOLE if whole else 0) | (CODE if span.kind == "code" else 0)
        flags |= ITEM if span.kind == "item" else 0
        yield span.start, span.end, flags
