"""Answers a new user of the demo would ask for, on the bundled PostgreSQL manual, with the
service's defaults (`answer_mode` auto): the HTML pages that hold the answers and a spread of
others as distractors, indexed as the demo indexes them (its HTML folder, with the manual's
URLs), over real HTTP."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from answer_service.cli.manual import PAGES_FOLDER, SOURCE_URL, manual_pages
from retrieval.embedder import EmbedderConfig, SentenceTransformerEmbedder
from retrieval.index.builder import build_index
from retrieval.ingest.source import IngestOptions, open_source
from tests.integration.conftest import ServiceFactory
from tests.support import post_answer

pytestmark = pytest.mark.integration

# Pages (`NAME.html`, documents `postgresql-15/NAME.html`) that answer the questions below.
ANSWERING = {
    "explicit-locking",
    "functions-admin",
    "index-locking",
    "libpq-cancel",
    "app-postgres",
    "ddl-system-columns",
    "routine-reindex",
    "routine-vacuuming",
    "runtime-config-connection",
    "sql-createindex",
    "sql-dropindex",
    "sql-reindex",
    "sql-vacuum",
}


@pytest.fixture(scope="module")
def manual_index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("manual")
    pages = sorted(manual_pages(folder / "cache").glob("*.html"))
    kept = folder / PAGES_FOLDER
    kept.mkdir()
    for n, page in enumerate(pages):
        if page.stem in ANSWERING or n % 60 == 0:
            shutil.copy(page, kept / page.name)
    source = open_source([kept], IngestOptions(source_url=SOURCE_URL))
    build_index(
        source, folder / "index", SentenceTransformerEmbedder(EmbedderConfig()), progress=False
    )
    return folder / "index"


def _page(doc_id: str) -> str:
    return Path(doc_id).stem


@pytest.fixture(scope="module")
def url(tiny_service: ServiceFactory, manual_index: Path) -> Iterator[str]:
    # The service's own defaults for the answer: auto, with its calibrated abstention.
    with tiny_service(index_dir=manual_index, mode="auto", abstain_below=None) as base:
        yield base


@pytest.mark.parametrize(
    ("question", "named"),
    [
        ("How do I build an index without locking out writes?", "CONCURRENTLY"),
        ("What does VACUUM FULL lock?", "ACCESS EXCLUSIVE"),
        # Definitions: the sentence leaves out what it is about, the quote names it.
        (
            "Which setting determines the maximum number of concurrent connections?",
            "max_connections",
        ),
        ("Which system column holds the ID of the transaction that inserted a row?", "xmin"),
        # A function's description below its signature, in a window that starts inside the
        # signature: the function's name is in the window before.
        ("Which function terminates a backend process?", "pg_terminate_backend"),
    ],
)
def test_the_answer_names_what_the_manual_says(url: str, question: str, named: str) -> None:
    body = post_answer(url, {"query": question, "stream": False}).json()
    assert named in body["answer"], body["answer"]
    assert body["done"]["form"] == "quote"
    cited = {c for citation in body["citations"] for c in citation["sources"]}
    assert cited
    sources = {s["number"]: s for s in body["sources"]}
    assert all(
        named.split()[0] in sources[n]["snippet"] or _page(sources[n]["doc_id"]) in ANSWERING
        for n in cited
    )
    # Each cited source links its section on www.postgresql.org, under its page's headings.
    for n in cited:
        page = _page(sources[n]["doc_id"])
        assert sources[n]["url"].startswith(f"{SOURCE_URL}{page}.html"), sources[n]
        assert sources[n]["heading_path"], sources[n]
    # A quote is short and ends where the manual's sentence ends.
    assert len(body["answer"].split()) <= 80


def test_a_quote_holds_whole_sentences_not_a_pages_heading_or_navigation(url: str) -> None:
    """Each page of the manual opens with its title, a navigation line ("Prev Up Chapter 34.
    libpq — C Library Home Next") and the title again; none of that is a sentence to quote."""
    body = post_answer(url, {"query": "How can I cancel a long-running query?", "stream": False})
    answer = body.json()["answer"]
    assert body.json()["done"]["form"] == "quote", answer
    assert "Prev" not in answer, answer
    assert "Home Next" not in answer, answer
    assert "Canceling Queries in Progress" not in answer, answer


def test_the_reader_rereads_where_the_scorer_is_in_doubt(url: str) -> None:
    questions = [
        "How do I build an index without locking out writes?",
        "What does VACUUM FULL lock?",
        "Which lock does REINDEX take?",
        "How can I rebuild a corrupted index?",
        "What does DROP INDEX CONCURRENTLY do?",
        "Which setting determines the maximum number of concurrent connections?",
    ]
    reads = [
        post_answer(url, {"query": q, "stream": False}).json()["done"]["timings_ms"]["read"]
        for q in questions
    ]
    # The packaged reader is loaded with the real embedder: where the scorer is unsure of its
    # best sentence it reads (time spent), where it is sure it does not (none).
    assert any(r > 0 for r in reads), reads
    assert any(r == 0 for r in reads), reads
