"""Each format's parser on small real files, and what a folder of them becomes (issue 40)."""

from __future__ import annotations

from pathlib import Path

import pytest

from retrieval.errors import UnreadableFileError
from retrieval.ingest.html_parser import HtmlParser
from retrieval.ingest.markdown_parser import MarkdownParser
from retrieval.ingest.pdf_parser import PdfParser
from retrieval.ingest.scan import MAX_FILE_BYTES, scan
from retrieval.ingest.source import IngestOptions, open_source
from retrieval.ingest.text_parser import TextParser
from tests.ingest_files import FIXTURES, ingest_folder, write_manual_pdf, write_scanned_pdf


def test_html_main_text_sections_anchors_and_canonical_link() -> None:
    page = HtmlParser().parse((FIXTURES / "guide.html").read_bytes(), "guide.html")
    assert page.url == "https://docs.example.org/guide/vacuum.html"
    assert [(s.heading_path, s.anchor) for s in page.sections] == [
        (("Vacuum Guide",), "top"),
        (("Vacuum Guide", "Autovacuum"), "autovacuum"),
        (("Vacuum Guide", "Autovacuum", "Tuning the daemon"), "autovacuum-tuning"),
        (("Vacuum Guide", "Freezing"), "freezing"),
    ]
    text = "\n".join(s.text for s in page.sections)
    assert "ALTER SYSTEM SET autovacuum_max_workers = 6;" in text
    for chrome in ("tracking", "color: black", "Next page", "Prev Up", "Copyright", "¶"):
        assert chrome not in text


def test_html_docbook_anchors_and_declared_encoding() -> None:
    page = HtmlParser().parse((FIXTURES / "reference" / "indexes.html").read_bytes(), "x")
    assert [s.anchor for s in page.sections] == ["INDEXES-TYPES", "INDEXES-TYPES-BTREE"]
    assert page.sections[1].heading_path[-1] == "11.2.1. B-Tree"
    latin1 = (FIXTURES / "reference" / "declared-latin1.html").read_bytes()
    assert "café server" in HtmlParser().parse(latin1, "x").sections[0].text


_DOCBOOK_PAGE = b"""<html><head><title>20.3. Connections</title></head><body>
<div class="navheader">Prev Up Next</div>
<div class="sect1" id="RUNTIME-CONFIG-CONNECTION"><div class="titlepage"><h2>20.3. Connections</h2></div>
<div class="toc"><dl class="toc"><dt>20.3.1. Connection Settings</dt></dl></div>
<div class="sect2" id="RUNTIME-CONFIG-CONNECTION-SETTINGS"><h3>20.3.1. Connection Settings</h3>
<div class="variablelist"><dl><dt>max_connections (integer)</dt>
<dd><p>Determines the maximum number of
   concurrent connections.</p>
<div class="note"><h3 class="title">Note</h3><p>On a standby server, set it higher.</p></div>
<p>The default is typically 100 connections.</p></dd></dl></div>
<table><tr><th>Item</th><th>Upper Limit</th><th></th></tr>
<tr><td>relation size</td><td>32 TB</td><td>with the default BLCKSZ</td></tr></table>
</div></div></body></html>"""


def test_html_docbook_blocks_are_paragraphs_and_admonitions_open_no_section() -> None:
    """As the sentence splitter reads a manual: a term on its own paragraph above its
    definition, a table row on one line, the text after a note still under its heading, and
    no table of contents."""
    page = HtmlParser().parse(_DOCBOOK_PAGE, "x")
    assert [s.heading_path[-1] for s in page.sections] == ["20.3.1. Connection Settings"]
    assert page.sections[0].text.split("\n\n") == [
        "max_connections (integer)",
        "Determines the maximum number of concurrent connections.",
        "Note",
        "On a standby server, set it higher.",
        "The default is typically 100 connections.",
        "Item \u00b7 Upper Limit",
        "relation size \u00b7 32 TB \u00b7 with the default BLCKSZ",
    ]


_TOC_PAGE = b"""<html><head><title>Chapter 67. B-Tree Indexes</title></head><body>
<div class="navheader">Prev Up Next</div>
<div class="chapter" id="BTREE"><div class="titlepage"><h2>Chapter 67. B-Tree Indexes</h2></div>
<div class="toc"><dl class="toc"><dt>67.1. Introduction</dt><dt>67.2. Behavior</dt></dl></div>
</div></body></html>"""


def test_a_page_of_only_navigation_is_told_from_an_empty_one() -> None:
    toc = HtmlParser().parse(_TOC_PAGE, "btree.html")
    assert (toc.has_text, toc.navigation) == (False, True)
    empty = HtmlParser().parse(b"<html><body><h1>Nothing yet</h1></body></html>", "x.html")
    assert (empty.has_text, empty.navigation) == (False, False)
    page = HtmlParser().parse(_DOCBOOK_PAGE, "x")
    assert (page.has_text, page.navigation) == (True, True)


def test_markdown_front_matter_nested_headings_and_plain_text() -> None:
    page = MarkdownParser().parse((FIXTURES / "notes.md").read_bytes(), "notes.md")
    assert (page.title, page.url) == (
        "Replication Notes",
        "https://docs.example.org/notes/replication",
    )
    assert [(s.heading_path[1:], s.anchor) for s in page.sections] == [
        ((), None),
        (("Setting up a standby",), "setting-up-a-standby"),
        (("Setting up a standby", "Hot standby"), "hot-standby"),
        (("Failover",), "failover"),
    ]
    hot = page.sections[2].text
    assert "A hot standby answers" in hot
    assert "SELECT pg_is_in_recovery();" in hot
    assert "**" not in hot
    assert "tags" not in page.sections[0].text
    assert "https://example.org/promote" not in page.sections[3].text


def test_pdf_pages_and_outline(tmp_path: Path) -> None:
    write_manual_pdf(tmp_path / "m.pdf")
    page = PdfParser().parse((tmp_path / "m.pdf").read_bytes(), "m.pdf")
    assert page.title == "Storage Manual"
    assert [(s.heading_path, s.page) for s in page.sections] == [
        (("Storage Manual", "Introduction"), 1),
        (("Storage Manual", "Introduction", "Scope"), 2),
        (("Storage Manual", "Reference"), 3),
    ]
    assert "fillfactor" in page.sections[2].text


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("bad/corrupt.pdf", "not a readable PDF"),
        ("bad/binary.txt", "binary file"),
        ("bad/empty.md", "empty file"),
        ("bad/latin1.txt", "not UTF-8"),
    ],
)
def test_unreadable_files_say_why(name: str, reason: str) -> None:
    parser = PdfParser() if name.endswith(".pdf") else TextParser()
    with pytest.raises(UnreadableFileError, match=reason):
        parser.parse((FIXTURES / name).read_bytes(), name)


def test_a_scanned_pdf_has_no_text_layer(tmp_path: Path) -> None:
    write_scanned_pdf(tmp_path / "s.pdf")
    with pytest.raises(UnreadableFileError, match="no text layer"):
        PdfParser().parse((tmp_path / "s.pdf").read_bytes(), "s.pdf")


def test_a_folder_becomes_documents_with_urls_and_skips(tmp_path: Path) -> None:
    source = open_source(
        [ingest_folder(tmp_path)], IngestOptions("manual", "https://mirror.example.org/d/")
    )
    documents = {d.doc_id: d for d in source.documents()}
    assert sorted(documents) == [
        "docs/guide.html",
        "docs/manual.pdf",
        "docs/notes.md",
        "docs/plain.txt",
        "docs/reference/declared-latin1.html",
        "docs/reference/indexes.html",
    ]
    assert {d.collection for d in documents.values()} == {"manual"}
    urls = [s.url for s in documents["docs/reference/indexes.html"].sections]
    assert urls[0] == "https://mirror.example.org/d/reference/indexes.html#INDEXES-TYPES"
    assert documents["docs/manual.pdf"].sections[1].url == (
        "https://mirror.example.org/d/manual.pdf#page=2"
    )
    # The page's own URL comes before the prefix.
    assert documents["docs/guide.html"].sections[1].url == (
        "https://docs.example.org/guide/vacuum.html#autovacuum"
    )
    for document in documents.values():
        for section in document.sections:
            assert document.text[section.start_char : section.end_char].strip()
    reasons = {Path(s.path).name: s.reason for s in source.skipped}
    assert set(reasons) == {
        "outside.txt",
        "binary.txt",
        "corrupt.pdf",
        "empty.md",
        "latin1.txt",
        "scanned.pdf",
    }
    assert "outside the paths given" in reasons["outside.txt"]


def test_a_single_jsonl_is_read_as_before(tmp_path: Path) -> None:
    from retrieval.corpus import corpus_checksum

    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"_id": "a", "title": "T", "text": "hello"}\n')
    source = open_source([corpus])
    assert source.checksum() == corpus_checksum(corpus)
    assert [d.doc_id for d in source.documents()] == ["a"]
    assert open_source([corpus], IngestOptions("other")).checksum() != source.checksum()


def test_a_huge_file_is_skipped_with_its_size(tmp_path: Path) -> None:
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "small.md").write_text("# Small\n\nA page of a normal size.\n")
    with (folder / "huge.txt").open("wb") as huge:  # sparse: no disk is spent
        huge.truncate(MAX_FILE_BYTES + 1)
    found = scan([folder])
    assert [file.shown for file in found.files] == ["docs/small.md"]
    assert [(s.path, s.reason) for s in found.skipped] == [
        (str(folder / "huge.txt"), "128 MiB, over the 128 MiB a file may be")
    ]
