"""Documents over HTTP (real MiniLM, faiss and BM25): PUT a Markdown page, an HTML page and a
PDF, find them, replace one, DELETE one; a key writes only where `--write` lets it; bad input
gets a clear 4xx and changes nothing; a folder sync leaves documents put over HTTP alone.
Quotes need no model; the fake SGLang only makes the service ready."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from answer_service.cli.main import main
from answer_service.runtime.keys.auth import ApiKey, digest, write_api_keys
from retrieval.index.generations import WriterLock, generation_number
from tests.fakes.fake_sglang import FakeSGLangState, create_fake_sglang
from tests.ingest_files import FIXTURES, write_manual_pdf
from tests.integration.conftest import ServiceFactory
from tests.support import serve_in_thread

pytestmark = pytest.mark.integration

WRITER_KEY = "ask_writer-key-for-the-documents-test-0000000000"
READER_KEY = "ask_reader-key-for-the-documents-test-0000000000"
NOTES = "/v1/collections/notes/documents"


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    docs = tmp_path_factory.mktemp("folder") / "docs"
    docs.mkdir()
    (docs / "vacuum.md").write_text(
        "# Vacuum\n\nVACUUM reclaims storage occupied by dead tuples on busy tables.\n"
    )
    (docs / "wal.md").write_text(
        "# WAL\n\nThe write-ahead log records each change before data files are written.\n"
    )
    return docs


@pytest.fixture(scope="module")
def index_dir(folder: Path) -> Path:
    out = folder.parent / "index"
    argv = ["index", "build", str(folder), "--out", str(out), "--device", "cpu"]
    assert main([*argv, "--collection", "manual"]) == 0
    return out


@pytest.fixture(scope="module")
def url(service: ServiceFactory, index_dir: Path, chatml_tokenizer_dir: Path) -> Iterator[str]:
    keys = index_dir.parent / "keys.json"
    limits: dict[str, Any] = {"rate_per_s": 100.0, "burst": 100}
    write_api_keys(
        keys,
        [
            ApiKey("writer", digest(WRITER_KEY), "standard", **limits, collections=None,
                   write=frozenset({"notes"})),
            ApiKey("reader", digest(READER_KEY), "standard", **limits,
                   collections=frozenset({"manual"})),
        ],
    )  # fmt: skip
    state = FakeSGLangState(model_path=str(chatml_tokenizer_dir))
    with (
        serve_in_thread(create_fake_sglang(state)) as sglang,
        service(index_dir=index_dir, sglang_url=sglang, api_keys_file=keys) as base,
    ):
        yield base


def _put(
    base: str, doc_id: str, body: bytes, kind: str, key: str = WRITER_KEY, **query: str
) -> httpx.Response:
    return httpx.put(
        f"{base}{NOTES}/{doc_id}",
        content=body,
        params=query,
        headers={"Content-Type": kind, **_auth(key)},
        timeout=120,
    )


def _top(url: str, query: str, key: str = WRITER_KEY) -> dict[str, Any]:
    body = {"query": query, "top_k": 3}
    found = httpx.post(f"{url}/v1/retrieve", json=body, headers=_auth(key), timeout=60).json()
    return dict(found["passages"][0])


def test_put_find_replace_delete(url: str, index_dir: Path, tmp_path: Path) -> None:
    before = generation_number(index_dir)
    markdown = b"# Checkpoints\n\nA checkpoint flushes every dirty buffer to disk.\n"
    put = _put(url, "checkpoints", markdown, "text/markdown", tags="ops,storage")
    assert put.status_code == 200, put.text
    assert put.json()["changed"] is True
    assert put.json()["generation"] == before + 1
    # Read at once by this process: the response came after the swap.
    assert _top(url, "What flushes dirty buffers to disk?")["doc_id"] == "checkpoints"

    html = (FIXTURES / "reference" / "indexes.html").read_bytes()
    assert _put(url, "indexes", html, "text/html; charset=utf-8").status_code == 200
    pdf = tmp_path / "manual.pdf"
    write_manual_pdf(pdf)
    put = _put(url, "storage", pdf.read_bytes(), "application/pdf", url="https://x.example/s.pdf")
    assert put.status_code == 200, put.text
    top = _top(url, "What does the fillfactor option leave room for?")
    assert top["doc_id"] == "storage"
    assert top["url"] == "https://x.example/s.pdf#page=3"

    listed = httpx.get(f"{url}{NOTES}", headers=_auth(WRITER_KEY), timeout=10).json()
    assert [d["id"] for d in listed["documents"]] == ["checkpoints", "indexes", "storage"]
    assert {d["origin"] for d in listed["documents"]} == {"api"}

    same = _put(url, "checkpoints", markdown, "text/markdown", tags="ops,storage")
    assert same.json()["changed"] is False  # as it was: nothing published
    replaced = b"# Checkpoints\n\nCheckpoint spreading is set by checkpoint_completion_target.\n"
    assert _put(url, "checkpoints", replaced, "text/markdown").status_code == 200
    old_id = quote("checkpoints#0", safe="")
    fetched = httpx.get(f"{url}/v1/passages/{old_id}", headers=_auth(WRITER_KEY), timeout=10)
    assert "checkpoint_completion_target" in fetched.json()["text"]

    gone = httpx.delete(f"{url}{NOTES}/checkpoints", headers=_auth(WRITER_KEY), timeout=120)
    assert gone.status_code == 200, gone.text
    fetched = httpx.get(f"{url}/v1/passages/{old_id}", headers=_auth(WRITER_KEY), timeout=10)
    assert fetched.status_code == 404
    assert _top(url, "checkpoint_completion_target spreading")["doc_id"] != "checkpoints"
    again = httpx.delete(f"{url}{NOTES}/checkpoints", headers=_auth(WRITER_KEY), timeout=10)
    assert again.status_code == 404


def test_keys_write_only_where_allowed(url: str, index_dir: Path) -> None:
    before = generation_number(index_dir)
    refused = _put(url, "mine", b"Some text about replicas.", "text/plain", key=READER_KEY)
    assert refused.status_code == 403
    assert "may not write" in refused.json()["error"]["message"]
    manual = "/v1/collections/manual/documents"
    other = httpx.put(
        f"{url}{manual}/x", content=b"text", headers={"Content-Type": "text/plain",
        **_auth(WRITER_KEY)}, timeout=10,
    )  # fmt: skip
    assert other.status_code == 403
    hidden = httpx.get(f"{url}{NOTES}", headers=_auth(READER_KEY), timeout=10)
    assert hidden.status_code == 404
    listed = httpx.get(f"{url}{manual}", headers=_auth(READER_KEY), timeout=10).json()
    assert {d["id"] for d in listed["documents"]} == {"docs/vacuum.md", "docs/wal.md"}
    assert generation_number(index_dir) == before


def test_bad_input_gets_a_clear_4xx_and_changes_nothing(url: str, index_dir: Path) -> None:
    before = generation_number(index_dir)
    corrupt = (FIXTURES / "bad" / "corrupt.pdf").read_bytes()
    cases = [
        (_put(url, "a", b"\x00\x01binary", "application/octet-stream"), 415, "Content-Type"),
        (_put(url, "a", corrupt, "application/pdf"), 422, "cannot be parsed"),
        (_put(url, "a", b"", "text/plain"), 422, "empty"),
        (_put(url, "a", b"   \n  ", "text/markdown"), 422, "empty file"),
        (_put(url, "a", b"x" * (33 * 1024 * 1024), "text/plain"), 413, "bytes"),
        (_put(url, "a%23b", b"hash in the id", "text/plain"), 422, "'#'"),
        (_put(url, "docs%2Fwal.md", b"text", "text/plain"), 404, "Not Found"),
    ]
    for response, status, words in cases:
        assert response.status_code == status, response.text
        assert words in response.text, response.text
    taken = httpx.put(
        f"{url}/v1/collections/notes/documents/docs", content=b"Replication text.",
        headers={"Content-Type": "text/plain", **_auth(WRITER_KEY)}, timeout=60,
    )  # fmt: skip
    assert taken.status_code == 200  # a new id; now the same id in another collection:
    moved = httpx.put(
        f"{url}/v1/collections/other/documents/docs", content=b"Other text.",
        headers={"Content-Type": "text/plain", **_auth(WRITER_KEY)}, timeout=60,
    )  # fmt: skip
    assert moved.status_code == 403  # no write there
    with WriterLock(index_dir):  # as an `index sync` running would
        busy = _put(url, "b", b"Text while a sync runs.", "text/plain")
    assert busy.status_code == 409
    assert "another build or sync" in busy.json()["error"]["message"]
    assert generation_number(index_dir) == before + 1  # only the one good PUT


def test_a_folder_sync_keeps_documents_put_over_http(
    url: str, folder: Path, index_dir: Path
) -> None:
    assert (
        _put(url, "kept", b"Logical replication publishes table changes.", "text/plain").status_code
        == 200
    )
    (folder / "wal.md").unlink()
    argv = ["index", "sync", str(folder), "--index", str(index_dir), "--device", "cpu"]
    assert main([*argv, "--collection", "manual"]) == 0
    listed = httpx.get(f"{url}{NOTES}", headers=_auth(WRITER_KEY), timeout=10).json()
    assert "kept" in {d["id"] for d in listed["documents"]}
    manual = httpx.get(
        f"{url}/v1/collections/manual/documents", headers=_auth(WRITER_KEY), timeout=10
    ).json()
    assert {d["id"] for d in manual["documents"]} == {"docs/vacuum.md"}
