"""The sentences of an index's passages, with their vectors, built once with the index.

Layout (`<index dir>/sentences/`): `spans.npy` (int32, one row per sentence: passage row, start
and end in the passage's text, its place in the passage, flags), `offsets.npy` (int64: the
sentences of passage row r are `offsets[r]:offsets[r + 1]`), `vectors.npy` (float16, the
embedder's unit vector of each sentence's text; zero for code blocks and headings, which are
never quoted) and `terms.json` (document frequencies of the passages' content terms, for IDF
weights). A sentence in the overlap of two windows is stored with each; its text is embedded
once.

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

from retrieval.embedder import Embedder
from retrieval.errors import IndexMismatchError
from retrieval.passage import Passage
from retrieval.progress import Progress
from retrieval.sentences.splitter import SpanKind, split_sentences
from retrieval.sentences.terms import Idf

SENTENCES_DIR = "sentences"
WHOLE, CODE, ITEM = 1, 2, 4
_MIN_EMBEDDED_WORDS = 3
_ENDS = (".", "!", "?", ":", '"', "'", ")", "\u201d")


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
    def build(
        cls,
        passages: Sequence[Passage],
        embedder: Embedder,
        *,
        batch_size: int = 128,
        progress: bool = False,
    ) -> SentenceStore:
        """Split every passage, embed each distinct sentence text once. Blocking."""
        spans: list[tuple[int, int, int, int, int]] = []
        offsets = [0]
        texts: dict[str, int] = {}
        text_of: list[int] = []
        for row, passage in enumerate(passages):
            first_window = row == 0 or section_break(passages[row - 1], passage)
            last_window = row + 1 == len(passages) or section_break(passage, passages[row + 1])
            for position, (start, end, flags) in enumerate(
                _spans(passage, first_window, last_window)
            ):
                spans.append((row, start, end, position, flags))
                text = passage.text[start:end]
                # Code blocks and headings are never quoted: no vector (a zero one), which keeps
                # a manual's build time near its passages' own.
                embedded = not flags & CODE and len(text.split()) >= _MIN_EMBEDDED_WORDS
                text_of.append(texts.setdefault(text, len(texts)) if embedded else -1)
            offsets.append(len(spans))
        distinct = sorted(texts, key=texts.__getitem__)
        # Sorted by length, batches pad little.
        order = sorted(range(len(distinct)), key=lambda i: len(distinct[i]))
        dimension = embedder.dimension
        encoded = np.zeros((len(distinct), dimension), dtype=np.float16)
        shown = Progress("sentence vectors", len(order), "sentences", enabled=progress)
        with shown:
            for at in range(0, len(order), batch_size):
                chunk = order[at : at + batch_size]
                batch = embedder.encode([distinct[i] for i in chunk], batch_size=batch_size)
                encoded[chunk] = batch.astype(np.float16)
                shown.advance(len(chunk))
        rows_of = np.asarray(text_of, dtype=np.int64)
        vectors = np.zeros((len(text_of), dimension), dtype=np.float16)
        vectors[rows_of >= 0] = encoded[rows_of[rows_of >= 0]]
        return cls(
            np.asarray(spans, dtype=np.int32).reshape(-1, 5),
            np.asarray(offsets, dtype=np.int64),
            vectors,
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
