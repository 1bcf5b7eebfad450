"""`answer-service index build` over a folder of HTML, Markdown, text and PDF files, with the real
MiniLM embedder, faiss and BM25: sections, heading paths, locations, URLs, skips, exit codes."""

from __future__ import annotations

from pathlib import Path

import pytest

from answer_service.cli.main import main
from retrieval.embedder import EmbedderConfig, SentenceTransformerEmbedder
from retrieval.index.loaded import LoadedIndex
from tests.ingest_files import FIXTURES, ingest_folder

pytestmark = pytest.mark.integration


def test_a_folder_is_indexed_by_section_and_skips_are_listed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = ingest_folder(tmp_path)
    out = tmp_path / "index"
    argv = ["index", "build", str(folder), "--out", str(out), "--device", "cpu"]
    code = main([*argv, "--collection", "manual", "--source-url", "https://m.example.org/"])
    assert code == 2  # built, with files skipped
    err = capsys.readouterr().err
    assert "6 file(s) skipped" in err
    assert "docs/bad/corrupt.pdf: not a readable PDF" in err

    embedder = SentenceTransformerEmbedder(EmbedderConfig(device="cpu"))
    index = LoadedIndex.open(out, embedder=embedder.name, dimension=embedder.dimension)
    passages = [index.passage(row) for row in range(len(index))]
    by_heading = {p.heading_path: p for p in passages}
    tuning = by_heading[("Vacuum Guide", "Autovacuum", "Tuning the daemon")]
    assert tuning.text.startswith("Raise autovacuum_max_workers")
    assert tuning.url == "https://docs.example.org/guide/vacuum.html#autovacuum-tuning"
    assert (tuning.path, tuning.anchor, tuning.collection) == (
        "docs/guide.html",
        "autovacuum-tuning",
        "manual",
    )
    scope = by_heading[("Storage Manual", "Introduction", "Scope")]
    assert (scope.page, scope.url) == (2, "https://m.example.org/manual.pdf#page=2")
    assert by_heading[("Replication Notes", "Failover")].url == (
        "https://docs.example.org/notes/replication#failover"
    )
    assert "secret" not in " ".join(p.text for p in passages)
    # Each passage is one section's: no passage holds two headings' text.
    assert not any("Freezing prevents" in p.text and "autovacuum" in p.text for p in passages)

    # The heading path is what BM25 sees: a subsection title finds its passage.
    assert index.lexical is not None
    row, _ = index.lexical.search("tuning the daemon", 1)[0]
    assert index.passage(row) == tuning


def test_exit_codes_when_all_or_nothing_is_indexed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["--out", str(tmp_path / "i"), "--device", "cpu"]
    assert main(["index", "build", str(FIXTURES / "notes.md"), *base]) == 0
    assert main(["index", "build", str(FIXTURES / "bad"), *base]) == 1
    # A manual's table-of-contents page is left out, and is no fault: exit 0, and it is named.
    folder = tmp_path / "manual"
    folder.mkdir()
    (folder / "notes.md").write_bytes((FIXTURES / "notes.md").read_bytes())
    (folder / "btree.html").write_text(
        "<html><head><title>Chapter 67. B-Tree Indexes</title></head><body><h2>Chapter 67</h2>"
        '<div class="toc"><dl><dt>67.1. Introduction</dt></dl></div></body></html>'
    )
    capsys.readouterr()
    assert (
        main(["index", "build", str(folder), "--out", str(tmp_path / "m"), "--device", "cpu"]) == 0
    )
    shown = capsys.readouterr()
    assert "1 navigation page(s) not indexed" in shown.out
    assert "manual/btree.html" in shown.out
    assert "skipped" not in shown.err
