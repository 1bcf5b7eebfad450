"""An index built from HTML and Markdown files (canonical links, front matter, `--source-url`),
served over real HTTP (real MiniLM, faiss and BM25): every surface that shows a source shows its
section's URL and heading path, and the OpenAI-shaped routes cite that URL. Quotes need no
model; the fake SGLang only makes the service ready."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import openai
import pytest
from httpx_sse import connect_sse
from openai.types.responses import ResponseOutputMessage, ResponseOutputText
from openai.types.responses.response_output_text import AnnotationURLCitation

from answer_service.cli.main import main
from tests.fakes.fake_sglang import FakeSGLangState, create_fake_sglang
from tests.ingest_files import FIXTURES
from tests.integration.conftest import ServiceFactory
from tests.support import serve_in_thread

pytestmark = pytest.mark.integration

QUESTION = "How many autovacuum workers should busy servers run?"
# guide.html's canonical link, with the section's anchor.
TUNING_URL = "https://docs.example.org/guide/vacuum.html#autovacuum-tuning"
TUNING_HEADINGS = ["Vacuum Guide", "Autovacuum", "Tuning the daemon"]
# reference/indexes.html has no canonical link: the prefix and its path.
BTREE_URL = "https://manual.example.org/reference/indexes.html#INDEXES-TYPES-BTREE"


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("sourced")
    folder = tmp / "docs"
    shutil.copytree(FIXTURES, folder, ignore=shutil.ignore_patterns("bad"))
    out = tmp / "index"
    argv = ["index", "build", str(folder), "--out", str(out), "--device", "cpu"]
    assert main([*argv, "--source-url", "https://manual.example.org/"]) == 0
    return out


@pytest.fixture(scope="module")
def url(service: ServiceFactory, index_dir: Path, chatml_tokenizer_dir: Path) -> Iterator[str]:
    state = FakeSGLangState(model_path=str(chatml_tokenizer_dir))
    with (
        serve_in_thread(create_fake_sglang(state)) as sglang,
        service(index_dir=index_dir, sglang_url=sglang) as base,
    ):
        yield base


def client_of(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=60)


QUOTE: dict[str, Any] = {"answer_mode": "quote", "top_k": 3}


def test_sources_show_the_section_url_and_heading_path(url: str) -> None:
    body = {"query": QUESTION, "stream": False, "ttft_budget_ms": 10_000, **QUOTE}
    answer = httpx.post(f"{url}/v1/answer", json=body, timeout=60).json()
    assert answer["done"]["form"] == "quote", answer["done"]
    first = answer["sources"][0]
    assert (first["url"], first["heading_path"]) == (TUNING_URL, TUNING_HEADINGS)
    assert "autovacuum_max_workers" in answer["answer"]
    for source in answer["sources"]:
        assert source["url"].startswith("https://"), source
    with (
        httpx.Client(timeout=60) as client,
        connect_sse(client, "POST", f"{url}/v1/answer", json={**body, "stream": True}) as events,
    ):
        streamed = next(json.loads(e.data) for e in events.iter_sse() if e.event == "sources")
    assert streamed["sources"] == answer["sources"]


def test_retrieve_and_passages_show_them_too(url: str) -> None:
    body = {"query": "B-trees handle equality and range queries", "top_k": 2}
    (first, *_) = httpx.post(f"{url}/v1/retrieve", json=body, timeout=30).json()["passages"]
    assert first["url"] == BTREE_URL
    assert first["heading_path"] == ["Index Types", "11.2. Index Types", "11.2.1. B-Tree"]
    fetched = httpx.get(f"{url}/v1/passages/{quote(first['id'], safe='')}", timeout=10).json()
    assert (fetched["url"], fetched["heading_path"]) == (first["url"], first["heading_path"])


def test_chat_cites_the_section_urls(url: str) -> None:
    completion = client_of(url).chat.completions.create(
        model="m", messages=[{"role": "user", "content": QUESTION}], extra_body=QUOTE
    )
    extra = completion.model_extra or {}
    assert extra["citations"][0] == TUNING_URL
    assert [r["url"] for r in extra["search_results"]] == extra["citations"]


def test_a_url_citation_leads_to_the_section(url: str) -> None:
    response = client_of(url).responses.create(model="m", input=QUESTION, extra_body=QUOTE)
    (item,) = response.output
    assert isinstance(item, ResponseOutputMessage)
    (part,) = item.content
    assert isinstance(part, ResponseOutputText)
    assert part.annotations
    first = part.annotations[0]
    assert isinstance(first, AnnotationURLCitation)
    assert first.url == TUNING_URL
    assert first.title == "Vacuum Guide"
    assert "autovacuum_max_workers" in part.text[first.start_index : first.end_index]
