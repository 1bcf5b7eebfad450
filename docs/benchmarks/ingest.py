"""Ingestion side by side in one run: our `index build`, our `index sync` after 5% of the pages
changed, and Haystack 2.x's indexing pipeline over the same HTML folder and the same MiniLM
files; then the serving process's memory while a sync is published and loaded.

    pip install -e '.[bench]'
    python docs/benchmarks/ingest.py --out docs/benchmarks/ingest.json   # --pages, --repeats

The pages: the PostgreSQL 15 manual as vendored (answer_service/demo_corpus: one JSONL line per
HTML page; the HTML itself is not vendored), every (1,169 / --pages)-th page in id order, each
rendered back to a minimal HTML page (`_render`: title, DocBook's navigation bar, numbered and
reference-page headings as h2/h3, paragraphs, code as pre). Every arm reads the same folder.

Each repeat runs the arms in turn, the order rotated per repeat: (build) our build API as
`index build` calls it; then (sync) five pages edited, one deleted and one added, and our sync
API as `index sync` calls it on the index that repeat built; (peer) HTMLToDocument (trafilatura)
→ DocumentSplitter → SentenceTransformersDocumentEmbedder → DocumentWriter into an
InMemoryDocumentStore. Models are loaded once before the timed runs, for every arm. Our phases
are timed by wrappers around the functions the build calls (the API reports only its total),
the peer's by wrapping each component's `run`. Then (memory) `answer-service serve` on a built
index, its RSS sampled every 20 ms while `answer-service index sync` runs as another process and
the service loads the new generation, a few rounds. Lives here, not in eval/bench/, because
eval/ is at its 7,000-line limit.
"""

from __future__ import annotations

import argparse
import gzip
import html
import json
import os
import platform
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from importlib.metadata import version
from pathlib import Path
from typing import Any
from unittest import mock
from urllib.parse import quote

import httpx
import psutil  # type: ignore[import-untyped]

import retrieval.index.builder as builder_module
import retrieval.index.revision as revision_module
import retrieval.index.sync as sync_module
import retrieval.index.writer as writer_module
from retrieval.embedder import (
    DEFAULT_EMBEDDER,
    EmbedderConfig,
    SentenceTransformerEmbedder,
    Vectors,
    resolve_model_path,
)
from retrieval.index.bm25_index import BM25Index
from retrieval.index.builder import build_index
from retrieval.index.sync import sync_index
from retrieval.ingest.source import DocumentSource, open_source
from retrieval.sentences.store import SentenceStore

CORPUS = Path("answer_service/demo_corpus/postgresql-15-docs.jsonl.gz")
FOLDER = "manual"  # every copy has this name: a sync matches files by their path under it
# A sync's change: 5% of the pages (at least 3), one of them deleted and one added.
CHANGED_FRACTION, DELETED, ADDED = 0.05, 1, 1
PEER_SPLIT = {"split_by": "word", "split_length": 150, "split_overlap": 30}
BATCH = 64
QUESTIONS = (
    "What does VACUUM do?",
    "How do I create a table?",
    "Which lock does an index build take?",
    "How is a role granted privileges?",
)
# The chat template's tokenizer, as `answer-service sglang setup` leaves it
TOKENIZER = Path.home() / ".cache/answer-service/models/smollm2-135m-instruct-bf16"

# ---- the pages -------------------------------------------------------------------------------

_NUMBERED = re.compile(r"^(?:[A-Z]|\d+)((?:\.\d+)*)\. \S.{0,120}$")
_REF_HEADINGS = frozenset(
    {"Synopsis", "Description", "Parameters", "Options", "Outputs", "Return Value", "Notes"}
    | {"Examples", "Compatibility", "Environment", "Diagnostics", "Files", "Bugs", "See Also"}
)


def _render(title: str, text: str) -> str:
    """A manual page's text as the minimal HTML it came from: the first block, with "Prev Up
    ... Next", DocBook's navigation bar; a block that starts with the title its h1; a short
    numbered line or a reference page's section name a heading; an indented block or a lone
    line a paragraph; anything else (a statement, lines of code) pre."""
    blocks = [b.strip("\n") for b in re.split(r"\n\s*\n", text) if b.strip()]
    body = []
    for n, block in enumerate(blocks):
        lines = block.splitlines()
        first = lines[0].strip()
        numbered = _NUMBERED.match(first) if len(lines) == 1 else None
        if n == 0 and any(line.startswith("Prev") for line in lines):
            body.append(f'<div class="navheader">{html.escape(" ".join(lines))}</div>')
        elif first == title:
            body.append(f"<h1>{html.escape(first)}</h1>")
            if lines[1:]:
                body.append(f"<p>{html.escape(' '.join(ln.strip() for ln in lines[1:]))}</p>")
        elif numbered or (len(lines) == 1 and first in _REF_HEADINGS):
            level = 2 + min(2, numbered.group(1).count(".")) if numbered else 2
            body.append(f"<h{level}>{html.escape(first)}</h{level}>")
        elif all(line.startswith(" ") for line in lines) or (
            len(lines) == 1 and not first.endswith(";")
        ):
            body.append(f"<p>{html.escape(' '.join(ln.strip() for ln in lines))}</p>")
        else:
            body.append(f"<pre>{html.escape(block)}</pre>")
    head = f'<meta charset="utf-8"><title>{html.escape(title)}</title>'
    return (
        f"<!DOCTYPE html>\n<html><head>{head}</head>\n<body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )


def render_pages(folder: Path, spare: Path, pages: int) -> list[str]:
    """Every (all / `pages`)-th page into `folder`; the next page of each stride into `spare`
    (pages a sync adds). Returns the chosen ids."""
    with gzip.open(CORPUS, "rt", encoding="utf-8") as lines:
        rows = sorted((json.loads(line) for line in lines), key=lambda row: row["_id"])
    stride = max(2, len(rows) // pages)
    folder.mkdir(parents=True)
    spare.mkdir(parents=True)
    chosen: list[str] = []
    for at in range(0, len(rows) - 1, stride):
        if len(chosen) == pages:
            break
        for row, target in ((rows[at], folder), (rows[at + 1], spare)):
            page = _render(row["title"], row["text"])
            (target / f"{row['_id']}.html").write_text(page, encoding="utf-8")
        chosen.append(rows[at]["_id"])
    return chosen


def change_pages(folder: Path, spare: Path, round_: int) -> dict[str, list[str]]:
    """5% of the pages: all but two edited (a paragraph added after the first), `DELETED`
    deleted and `ADDED` added from `spare`; another set for each round."""
    names = sorted(p.name for p in folder.glob("*.html"))
    edited = _edited(len(names))
    step = len(names) // (edited + DELETED + 1)
    picks = [names[(k * step + round_) % len(names)] for k in range(1, edited + DELETED + 1)]
    for name in picks[:edited]:
        page = (folder / name).read_text(encoding="utf-8")
        extra = (
            f"<p>Revision {round_} of this page notes that the settings described here take "
            "effect after the server reloads its configuration.</p>"
        )
        (folder / name).write_text(page.replace("</p>", "</p>\n" + extra, 1), encoding="utf-8")
    for name in picks[edited:]:
        (folder / name).unlink()
    added = sorted(p.name for p in spare.glob("*.html"))[round_ * ADDED : (round_ + 1) * ADDED]
    for name in added:
        shutil.copy(spare / name, folder / name)
    return {"edited": picks[:edited], "deleted": picks[edited:], "added": added}


def _edited(pages: int) -> int:
    return max(1, round(pages * CHANGED_FRACTION) - DELETED - ADDED)


# ---- our phases --------------------------------------------------------------------------------


class PhaseClock:
    """Seconds per phase; `encoding` names the phase an embedder call is in."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.encoding = "embed_passages"
        self.passage_texts: list[str] = []
        self.sentence_texts = 0

    @contextmanager
    def timing(self, phase: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] += time.perf_counter() - started

    def report(self, total_s: float) -> dict[str, float]:
        phases = dict(self.seconds)
        if "sentences" in phases:  # SentenceStore.build: splitting, embedding, term counts
            phases["sentences_split"] = phases.pop("sentences") - phases.get("embed_sentences", 0.0)
        phases["other"] = total_s - sum(phases.values())
        return {name: round(value, 3) for name, value in phases.items()}


class TimedEmbedder:
    """The service's embedder (the `Embedder` protocol), its encode calls timed by phase."""

    def __init__(self, inner: SentenceTransformerEmbedder, clock: PhaseClock) -> None:
        self._inner = inner
        self._clock = clock

    @property
    def name(self) -> str:
        return self._inner.name

    @property
    def dimension(self) -> int:
        return self._inner.dimension

    def warm_up(self) -> None:
        self._inner.warm_up()

    def token_spans(self, text: str) -> Sequence[tuple[int, int]]:
        return self._inner.token_spans(text)

    def encode(self, texts: Sequence[str], *, batch_size: int = 32) -> Vectors:
        with self._clock.timing(self._clock.encoding):
            vectors = self._inner.encode(texts, batch_size=batch_size)
        if self._clock.encoding == "embed_passages":
            self._clock.passage_texts.extend(texts)
        else:
            self._clock.sentence_texts += len(texts)
        return vectors

    def encode_with_spans(
        self,
        texts: Sequence[str],
        spans: Sequence[Sequence[tuple[int, int]]],
        *,
        batch_size: int = 32,
    ) -> tuple[Vectors, list[Vectors]]:
        """The passage pass, which pools the sentences' vectors too: timed as the passages'."""
        with self._clock.timing("embed_passages"):
            found = self._inner.encode_with_spans(texts, spans, batch_size=batch_size)
        self._clock.passage_texts.extend(texts)
        self._clock.sentence_texts += sum(len(each) for each in spans)
        return found


class TimedSource:
    """A `DocumentSource` whose `documents()` (reading and parsing the files) is timed."""

    def __init__(self, inner: DocumentSource, clock: PhaseClock) -> None:
        self._inner = inner
        self._clock = clock

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def documents(self, only: Any = None) -> Iterator[Any]:
        found = iter(self._inner.documents(only))
        while True:
            with self._clock.timing("parse"):
                document = next(found, None)
            if document is None:
                return
            yield document


def _timed(clock: PhaseClock, phase: str, call: Callable[..., Any]) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        with clock.timing(phase):
            result = call(*args, **kwargs)
            return list(result) if phase == "split" else result

    return run


@contextmanager
def instrumented(embedder: SentenceTransformerEmbedder) -> Iterator[tuple[Any, PhaseClock]]:
    """Wrappers, for one run, around what build and sync call, each adding its time to its
    phase; what they compute is unchanged."""
    clock = PhaseClock()
    sentences_build = SentenceStore.build

    def build_sentences(cls: type, *args: Any, **kwargs: Any) -> SentenceStore:
        clock.encoding = "embed_sentences"
        try:
            with clock.timing("sentences"):
                return sentences_build(*args, **kwargs)
        finally:
            clock.encoding = "embed_passages"

    bm25_build = BM25Index.build
    opened = open_source  # what sync_index calls, wrapped below
    with ExitStack() as patches:
        for module in (builder_module, revision_module):
            split = _timed(clock, "split", module.split_document)
            patches.enter_context(mock.patch.object(module, "split_document", split))
        for module in (writer_module, revision_module):
            ann = _timed(clock, "faiss", module.build_search_index)
            patches.enter_context(mock.patch.object(module, "build_search_index", ann))
        for module in (builder_module, sync_module):
            hashing = _timed(clock, "hash", module.file_hash)
            patches.enter_context(mock.patch.object(module, "file_hash", hashing))
        bm25 = classmethod(lambda cls, *a, **k: _timed(clock, "bm25", bm25_build)(*a, **k))
        patches.enter_context(mock.patch.object(BM25Index, "build", bm25))
        patches.enter_context(
            mock.patch.object(SentenceStore, "build", classmethod(build_sentences))
        )
        source = lambda *a, **k: TimedSource(opened(*a, **k), clock)  # noqa: E731
        patches.enter_context(mock.patch.object(sync_module, "open_source", source))
        yield TimedEmbedder(embedder, clock), clock


# ---- the arms ----------------------------------------------------------------------------------


def _tokens(tokenizer: Any, texts: Sequence[str]) -> int:
    """How many tokens the embedder read (its inputs cut at 256), counted after the run."""
    lengths = tokenizer(list(texts), add_special_tokens=True, truncation=True, max_length=256)
    return sum(len(ids) for ids in lengths["input_ids"])


def run_build(folder: Path, out: Path, embedder: SentenceTransformerEmbedder) -> dict[str, Any]:
    with instrumented(embedder) as (timed, clock):
        source = TimedSource(open_source([folder]), clock)
        started = time.perf_counter()
        report = build_index(source, out, timed, batch_size=BATCH, progress=False, force=True)
        seconds = time.perf_counter() - started
    return {
        "seconds": round(seconds, 3),
        "documents": report.documents,
        "passages": report.manifest.passage_count,
        "embedded_passages": len(clock.passage_texts),
        "embedded_tokens": _tokens(embedder.tokenizer, clock.passage_texts),
        "sentence_vectors": clock.sentence_texts,
        "phases_s": clock.report(seconds),
    }


def run_sync(folder: Path, index: Path, embedder: SentenceTransformerEmbedder) -> dict[str, Any]:
    with instrumented(embedder) as (timed, clock):
        started = time.perf_counter()
        report = sync_index([folder], index, timed, batch_size=BATCH, progress=False)
        seconds = time.perf_counter() - started
    revision = report.revision
    return {
        "seconds": round(seconds, 3),
        "documents": report.added + report.changed + report.removed,
        "changes": {"added": report.added, "changed": report.changed, "removed": report.removed},
        "unchanged": report.unchanged,
        "passages": revision.passages,
        "embedded_passages": revision.embedded_passages,
        "embedded_tokens": _tokens(embedder.tokenizer, clock.passage_texts),
        "sentence_vectors": clock.sentence_texts,
        "phases_s": clock.report(seconds),
    }


class HaystackPeer:
    """Haystack 2.x's indexing pipeline, built and warmed once (a component joins one pipeline
    only); each run writes into a new in-memory store."""

    def __init__(self) -> None:
        from haystack import Pipeline
        from haystack.components.converters import HTMLToDocument
        from haystack.components.embedders import SentenceTransformersDocumentEmbedder
        from haystack.components.preprocessors import DocumentSplitter
        from haystack.components.writers import DocumentWriter
        from haystack.document_stores.in_memory import InMemoryDocumentStore
        from haystack.utils import ComponentDevice

        self.embedder = SentenceTransformersDocumentEmbedder(
            model=resolve_model_path(DEFAULT_EMBEDDER),
            device=ComponentDevice.from_str("cpu"),
            batch_size=BATCH,
            progress_bar=False,
            normalize_embeddings=True,
            local_files_only=True,
        )
        self.writer = DocumentWriter(document_store=InMemoryDocumentStore())
        self.clock = PhaseClock()
        self.pipeline = Pipeline()
        components: dict[str, Any] = {
            "converter": HTMLToDocument(),
            "splitter": DocumentSplitter(**PEER_SPLIT),  # type: ignore[arg-type]
            "embedder": self.embedder,
            "writer": self.writer,
        }
        for name, component in components.items():
            self._time_runs(name, component)
            self.pipeline.add_component(name, component)
        self.pipeline.connect("converter.documents", "splitter.documents")
        self.pipeline.connect("splitter.documents", "embedder.documents")
        self.pipeline.connect("embedder.documents", "writer.documents")

    def _time_runs(self, name: str, component: Any) -> None:
        call = component.run

        def run(*args: Any, **kwargs: Any) -> Any:
            with self.clock.timing(name):
                return call(*args, **kwargs)

        component.run = run

    def warm_up(self) -> None:
        self.pipeline.warm_up()

    def _tokenizer(self) -> Any:
        backend = self.embedder.embedding_backend
        assert backend is not None, "warm_up() loads it"
        return backend.model.tokenizer

    def config(self) -> dict[str, Any]:
        return {
            "haystack": version("haystack-ai"),
            "trafilatura": version("trafilatura"),
            "pipeline": "HTMLToDocument -> DocumentSplitter -> "
            "SentenceTransformersDocumentEmbedder -> DocumentWriter(InMemoryDocumentStore)",
            "splitter": PEER_SPLIT,
            "batch_size": BATCH,
            "normalize_embeddings": True,
        }

    def run(self, folder: Path) -> dict[str, Any]:
        from haystack.document_stores.in_memory import InMemoryDocumentStore

        store = InMemoryDocumentStore()
        self.writer.document_store = store
        self.clock = PhaseClock()
        sources = sorted(folder.glob("*.html"))
        started = time.perf_counter()
        self.pipeline.run({"converter": {"sources": sources}})
        seconds = time.perf_counter() - started
        written = store.filter_documents()
        texts = [d.content or "" for d in written]
        return {
            "seconds": round(seconds, 3),
            "documents": len(sources),
            "documents_converted": len({d.meta.get("source_id") for d in written}),
            "passages": len(written),
            "embedded_passages": len(written),
            "embedded_tokens": _tokens(self._tokenizer(), texts),
            "phases_s": self.clock.report(seconds),
        }


# ---- the serving process's memory ------------------------------------------------------------


def _command(name: str) -> str:
    """The console script of this environment (`answer-service`)."""
    return str(Path(sys.executable).parent / name)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class RssSampler:
    """A process's RSS every `every_s` in a thread; `marks` name moments in the series."""

    def __init__(self, pid: int, every_s: float = 0.02) -> None:
        self._process = psutil.Process(pid)
        self._every_s = every_s
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.monotonic(), self._process.memory_info().rss))
            time.sleep(self._every_s)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def between(self, start: float, end: float) -> list[int]:
        return [rss for at, rss in self.samples if start <= at <= end]


def _ask(client: httpx.Client, query: str) -> int:
    body = {"query": query, "ttft_budget_ms": 10_000, "answer_mode": "quote", "stream": False}
    return client.post("/v1/answer", json=body).status_code


def _wait_ready(client: httpx.Client, server: subprocess.Popen[bytes], timeout_s: float) -> None:
    """Until warm-up has finished (the index watcher starts then): a quote answers 200."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError("answer-service serve exited")
        try:
            if _ask(client, "What does VACUUM do?") == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    raise RuntimeError("answer-service serve was not ready in time")


def _served(client: httpx.Client, passage_id: str) -> bool:
    return client.get(f"/v1/passages/{quote(passage_id, safe='')}").status_code == 200


def _sync_round(
    client: httpx.Client, sampler: RssSampler, folder: Path, spare: Path, index: Path, round_: int
) -> dict[str, Any]:
    """One sync beside the serving process: RSS before (the 3 s before it), its peak from the
    sync's start until 5 s after the service answers from the new generation."""
    changes = change_pages(folder, spare, round_ + 1)
    added = f"{FOLDER}/{changes['added'][0]}#0"  # its first passage: served once swapped in
    time.sleep(3.0)
    started = time.monotonic()
    sync = subprocess.run(
        [
            _command("answer-service"),
            "index",
            "sync",
            str(folder),
            "--index",
            str(index),
            "--device",
            "cpu",
        ],
        capture_output=True,
        text=True,
    )
    synced = time.monotonic()
    while not _served(client, added):
        if time.monotonic() - synced > 30:
            raise RuntimeError(f"the new generation was not served in 30 s: {sync.stderr[-500:]}")
        time.sleep(0.05)
    served = time.monotonic()
    time.sleep(5.0)
    before = sampler.between(started - 3.0, started)
    during = sampler.between(started, time.monotonic())
    mib = 1 << 20
    return {
        "round": round_,
        "sync_exit": sync.returncode,
        "sync_output": sync.stdout.strip().splitlines()[-1:],
        "sync_s": round(synced - started, 2),
        "served_after_sync_s": round(served - synced, 2),
        "rss_before_mib": round(statistics.median(before) / mib, 1),
        "rss_peak_mib": round(max(during) / mib, 1),
        "rss_end_mib": round(during[-1] / mib, 1),
        "peak_over_before": round(max(during) / statistics.median(before), 3),
    }


def serving_memory(
    folder: Path, index: Path, spare: Path, rounds: int, tokenizer: Path
) -> dict[str, Any]:
    """`answer-service serve` on a built index, a client asking for quotes every 0.2 s
    throughout, and `rounds` syncs of `folder` into `index`. No SGLang: a quote needs none, and `--tokenizer` (the chat
    template's) spares waiting for it, so warm-up finishes and the index watcher runs."""
    port = _free_port()
    server = subprocess.Popen(
        [
            _command("answer-service"),
            "serve",
            "--index",
            str(index),
            "--port",
            str(port),
            "--sglang-url",
            "http://127.0.0.1:9",
            "--tokenizer",
            str(tokenizer),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    stop = threading.Event()
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
            _wait_ready(client, server, timeout_s=600)

            def ask() -> None:
                with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as asker:
                    while not stop.is_set():
                        for question in QUESTIONS:
                            with suppress(httpx.HTTPError):  # the service stopping at the end
                                _ask(asker, question)
                            time.sleep(0.2)

            asker = threading.Thread(target=ask, daemon=True)
            asker.start()
            time.sleep(15.0)  # the reranker loads after warm-up; every question asked once
            with RssSampler(server.pid) as sampler:
                results = [
                    _sync_round(client, sampler, folder, spare, index, r) for r in range(rounds)
                ]
    finally:
        stop.set()
        server.terminate()
        server.wait(timeout=30)
    index_mib = sum(p.stat().st_size for p in index.resolve().rglob("*") if p.is_file()) / (1 << 20)
    return {
        "how": "answer-service serve (default settings: ANSWER_INDEX_WATCH_S 2 s, an old "
        "generation closed 480 s after the swap) on a build of the same pages; RSS of its "
        "process every 20 ms; `answer-service index sync` run as another process, 5% changed "
        "each round; a quote asked every 0.2 s throughout",
        "index_dir_mib_on_disk": round(index_mib, 1),
        "peak_over_before_max": max(r["peak_over_before"] for r in results),
        "peak_over_first_before": round(
            max(r["rss_peak_mib"] for r in results) / results[0]["rss_before_mib"], 3
        ),
        "rounds": results,
    }


# ---- the run -----------------------------------------------------------------------------------


def _repeat(
    repeat: int,
    base: Path,
    spare: Path,
    work: Path,
    embedder: SentenceTransformerEmbedder,
    peer: HaystackPeer,
) -> list[dict[str, Any]]:
    """Our build and then sync on a copy of the pages, and the peer on the pages; which goes
    first alternates."""
    folder = work / f"r{repeat}" / FOLDER  # kept: the memory rounds use the last one
    shutil.copytree(base, folder)
    index = work / f"r{repeat}" / "idx"
    runs: list[dict[str, Any]] = []
    for arm in ("ours", "peer") if repeat % 2 == 0 else ("peer", "ours"):
        if arm == "ours":
            record = {"arm": "build", "load_1m": os.getloadavg()[0]}
            runs.append({**record, **run_build(folder, index, embedder)})
            changes = change_pages(folder, spare, 0)
            record = {"arm": "sync", "load_1m": os.getloadavg()[0], "changed_pages": changes}
            runs.append({**record, **run_sync(folder, index, embedder)})
        else:
            runs.append({"arm": "peer", "load_1m": os.getloadavg()[0], **peer.run(base)})
    for run in runs:
        run["repeat"] = repeat
        print(f"repeat {repeat} {run['arm']}: {run['seconds']:.1f} s {run['phases_s']}", flush=True)
    return runs


def _paired(runs: list[dict[str, Any]], top: str, bottom: str, per: str | None = None) -> Any:
    """Within each repeat (the same minutes' load on both), `top`'s seconds over `bottom`'s,
    per `per` when given; the values and their median."""
    arms: dict[int, dict[str, float]] = defaultdict(dict)
    for run in runs:
        arms[run["repeat"]][run["arm"]] = run["seconds"] / (run[per] if per else 1)
    values = [round(a[top] / a[bottom], 3) for a in arms.values()]
    return {"per_repeat": values, "median": round(statistics.median(values), 3)}


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    medians = {}
    for arm in ("build", "sync", "peer"):
        mine = [r for r in runs if r["arm"] == arm]

        def median(value: Callable[[dict[str, Any]], float], mine: list[Any] = mine) -> float:
            return float(statistics.median(value(r) for r in mine))

        medians[arm] = {
            "seconds": round(median(lambda r: r["seconds"]), 2),
            "documents": mine[0]["documents"],
            "passages_embedded": mine[0]["embedded_passages"],
            "tokens_embedded": mine[0]["embedded_tokens"],
            "documents_per_s": round(median(lambda r: r["documents"] / r["seconds"]), 2),
            "passages_per_s": round(median(lambda r: r["embedded_passages"] / r["seconds"]), 1),
            "tokens_per_s": round(median(lambda r: r["embedded_tokens"] / r["seconds"])),
            "phases_s": {
                k: round(statistics.median(r["phases_s"].get(k, 0.0) for r in mine), 2)
                for k in mine[0]["phases_s"]
            },
        }
    ratios = {
        "sync_over_build_s": _paired(runs, "sync", "build"),
        "build_over_peer_s": _paired(runs, "build", "peer"),
        "build_over_peer_s_per_token_embedded": _paired(runs, "build", "peer", "embedded_tokens"),
    }
    return {"medians": medians, "ratios": ratios}


def _machine() -> dict[str, Any]:
    import torch

    info = Path("/proc/cpuinfo").read_text().splitlines()
    model = next((ln.split(":", 1)[1].strip() for ln in info if ln.startswith("model name")), "")
    flags = next((ln for ln in info if ln.startswith("flags")), "")
    return {
        "nproc": os.cpu_count(),
        "cpu_model": model or platform.processor(),
        "avx512": "avx512f" in flags,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
    }


def _commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True).stdout.strip()

    dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    return git("rev-parse", "HEAD") + ("-dirty" if dirty else "")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--pages", type=int, default=150)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--memory-rounds", type=int, default=3)
    parser.add_argument("--tokenizer", type=Path, default=TOKENIZER)
    args = parser.parse_args()
    commit, load_before = _commit(), os.getloadavg()[0]
    embedder = SentenceTransformerEmbedder(EmbedderConfig(device="cpu"))
    embedder.warm_up()
    peer = HaystackPeer()
    peer.warm_up()
    with tempfile.TemporaryDirectory(prefix="ingest-bench-") as tmp:
        work = Path(tmp)
        base, spare = work / "pages" / FOLDER, work / "spare"
        chosen = render_pages(base, spare, args.pages)
        # Untimed: each arm's first run pays one-time costs (torch's first input shapes).
        small = work / "small" / FOLDER
        shutil.copytree(base, small, ignore=_all_but_eight)
        run_build(small, work / "small" / "idx", embedder)
        peer.run(small)
        runs = [
            r for n in range(args.repeats) for r in _repeat(n, base, spare, work, embedder, peer)
        ]
        out = _result(args, commit, load_before, chosen, peer, runs)
        args.out.write_text(json.dumps(out, indent=2) + "\n")
        print(json.dumps({k: out[k] for k in ("medians", "ratios")}, indent=2), flush=True)
        if args.memory_rounds:
            # the last repeat's pages and index, as its sync left them
            last = work / f"r{args.repeats - 1}"
            memory = serving_memory(
                last / FOLDER, last / "idx", spare, args.memory_rounds, args.tokenizer
            )
            out = {**out, "serving_memory": memory}
            args.out.write_text(json.dumps(out, indent=2) + "\n")
            print(json.dumps({k: v for k, v in memory.items() if k != "how"}, indent=2))


def _all_but_eight(_: str, names: list[str]) -> list[str]:
    return sorted(names)[8:]


def _result(
    args: argparse.Namespace,
    commit: str,
    load_before: float,
    chosen: list[str],
    peer: HaystackPeer,
    runs: list[dict[str, Any]],
) -> dict[str, Any]:
    return {
        "benchmark": "ingest",
        "commit": commit,
        "command": f"python docs/benchmarks/ingest.py --out {args.out} --pages {args.pages} "
        f"--repeats {args.repeats} --memory-rounds {args.memory_rounds}",
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": _machine(),
        "load": {
            "load_1m_at_start": round(load_before, 2),
            "load_1m_at_end": round(os.getloadavg()[0], 2),
            "note": "2 cores shared with other sessions' work; each run records its 1-minute "
            "load; ratios are taken within a repeat, whose arms ran minutes apart",
        },
        "config": {
            "pages": len(chosen),
            "page_ids": chosen,
            "html": "rendered from the vendored JSONL (see the script's docstring)",
            "changes_per_sync": {
                "edited": _edited(len(chosen)),
                "deleted": DELETED,
                "added": ADDED,
                "of_pages": len(chosen),
            },
            "embedder": DEFAULT_EMBEDDER,
            "model_files": "the packaged copy the service loads (resolve_model_path)",
            "ours": {"passage_tokens": 200, "overlap_tokens": 40, "batch_size": BATCH},
            "peer": peer.config(),
        },
        **summarize(runs),
        "runs": runs,
    }


if __name__ == "__main__":
    main()
