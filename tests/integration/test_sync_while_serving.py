"""`index sync` under a serving process (real MiniLM, faiss and BM25 over real HTTP): pages
changed, added and deleted are synced while questions keep coming; the service switches to
the new generation by itself, no question gets an error, and a deleted page is gone from
every surface. A sync killed halfway leaves the old generation serving. Quotes need no model;
the fake SGLang only makes the service ready."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from answer_service.cli.main import main
from retrieval.index.generations import generation_number
from tests.fakes.fake_sglang import FakeSGLangState, create_fake_sglang
from tests.integration.conftest import ServiceFactory
from tests.support import serve_in_thread

pytestmark = pytest.mark.integration

PAGES = {
    "vacuum.md": "# Vacuum\n\nVACUUM reclaims storage occupied by dead tuples. Run it "
    "regularly on busy tables so that dead rows do not bloat them.\n",
    "wal.md": "# Write-ahead log\n\nThe write-ahead log records every change before the data "
    "files are written, so a crash loses no committed transaction.\n",
    "ports.md": "# Connections\n\nThe server listens on TCP port 5432 by default; change it "
    "with the port setting in postgresql.conf.\n",
    "roles.md": "# Roles\n\nA role owns database objects and holds privileges. CREATE ROLE "
    "makes one; GRANT gives it privileges on tables.\n",
}
GONE = "docs/ports.md"
QUOTE: dict[str, Any] = {"answer_mode": "quote", "top_k": 3, "stream": False}


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    docs = tmp_path / "docs"
    docs.mkdir()
    for name, text in PAGES.items():
        (docs / name).write_text(text)
    return docs


@pytest.fixture
def index_dir(folder: Path, tmp_path: Path) -> Path:
    out = tmp_path / "index"
    assert main(["index", "build", str(folder), "--out", str(out), "--device", "cpu"]) == 0
    return out


@pytest.fixture
def url(service: ServiceFactory, index_dir: Path, chatml_tokenizer_dir: Path) -> Iterator[str]:
    state = FakeSGLangState(model_path=str(chatml_tokenizer_dir))
    with (
        serve_in_thread(create_fake_sglang(state)) as sglang,
        service(index_dir=index_dir, sglang_url=sglang, index_watch_s=0.5) as base,
    ):
        yield base


def _answer(url: str, query: str) -> dict[str, Any]:
    body = {"query": query, "ttft_budget_ms": 10_000, **QUOTE}
    response = httpx.post(f"{url}/v1/answer", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return dict(response.json())


def _retrieved(url: str, query: str) -> list[dict[str, Any]]:
    response = httpx.post(f"{url}/v1/retrieve", json={"query": query, "top_k": 4}, timeout=60)
    assert response.status_code == 200, response.text
    return list(response.json()["passages"])


def test_sync_while_serving(url: str, folder: Path, index_dir: Path) -> None:
    port_answer = _answer(url, "What TCP port does the server listen on by default?")
    assert port_answer["sources"][0]["doc_id"] == GONE
    assert "5432" in port_answer["answer"]
    gone_id = quote(port_answer["sources"][0]["id"], safe="")
    assert httpx.get(f"{url}/v1/passages/{gone_id}", timeout=10).status_code == 200
    cached = _answer(url, "How does VACUUM deal with dead tuples?")  # now in the answer cache

    statuses: list[int] = []
    stop = threading.Event()

    def ask_all_along() -> None:
        questions = ["What does the write-ahead log record?", "How do I give a role privileges?"]
        while not stop.is_set():
            for question in questions:
                body = {"query": question, "ttft_budget_ms": 10_000, **QUOTE}
                statuses.append(httpx.post(f"{url}/v1/answer", json=body, timeout=60).status_code)

    client = threading.Thread(target=ask_all_along)
    client.start()
    try:
        (folder / "ports.md").unlink()
        (folder / "vacuum.md").write_text(
            "# Vacuum\n\nAutovacuum launches workers that vacuum tables in the background; "
            "manual VACUUM is rarely needed since it was added.\n"
        )
        (folder / "replication.md").write_text(
            "# Replication\n\nA standby server replays the primary's write-ahead log and can "
            "answer read-only queries while it does.\n"
        )
        argv = ["index", "sync", str(folder), "--index", str(index_dir), "--device", "cpu"]
        assert main(argv) == 0
        synced_at = time.monotonic()
        while not any(p["doc_id"] == "docs/replication.md" for p in _retrieved(url, "standby")):
            assert time.monotonic() - synced_at < 5.0, "not serving the new generation in 5 s"
            time.sleep(0.1)
        while len(statuses) < 6:
            time.sleep(0.05)
    finally:
        stop.set()
        client.join()
    assert statuses
    assert set(statuses) == {200}, statuses

    # The deleted page: not retrieved, not quoted, not cited, not fetched.
    assert httpx.get(f"{url}/v1/passages/{gone_id}", timeout=10).status_code == 404
    for passage in _retrieved(url, "TCP port 5432 postgresql.conf"):
        assert passage["doc_id"] != GONE
    answer = _answer(url, "What TCP port does the server listen on by default?")
    assert all(source["doc_id"] != GONE for source in answer["sources"])
    assert "5432" not in answer["answer"]
    # The changed page: the cached answer built from its old text is not served again.
    fresh = _answer(url, "How does VACUUM deal with dead tuples?")
    assert fresh["answer"] != cached["answer"] or "Autovacuum" in fresh["answer"]
    assert "bloat" not in fresh["answer"]


def test_a_sync_killed_halfway_leaves_the_old_generation_serving(
    url: str, folder: Path, index_dir: Path
) -> None:
    before = _retrieved(url, "TCP port")
    for number in range(40):  # enough to embed for a while
        (folder / f"extra{number}.md").write_text(
            f"# Extra {number}\n\n" + "Checkpoints flush dirty buffers to disk. " * 200
        )
    (folder / "ports.md").unlink()
    sync = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "answer_service.cli.main",
            "index",
            "sync",
            str(folder),
            "--index",
            str(index_dir),
            "--device",
            "cpu",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(Path.cwd())},
    )
    deadline = time.monotonic() + 120
    while not list((index_dir / "generations").glob(".staging-*")):
        assert sync.poll() is None, "the sync ended before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.05)
    sync.send_signal(signal.SIGKILL)
    sync.wait()
    assert generation_number(index_dir) == 1
    time.sleep(1.0)  # two of the service's checks
    assert _retrieved(url, "TCP port") == before
    assert any(p["doc_id"] == GONE for p in before)
    # The killed writer's lock died with it: the next sync runs and clears its leftovers.
    assert main(["index", "sync", str(folder), "--index", str(index_dir), "--device", "cpu"]) == 0
    assert generation_number(index_dir) == 2
    assert not list((index_dir / "generations").glob(".staging-*"))
    manifest = json.loads((index_dir / "manifest.json").read_text())
    assert manifest["passage_count"] > len(before)
