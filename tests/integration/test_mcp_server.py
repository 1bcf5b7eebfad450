"""The MCP server from outside, driven by the SDK's own client: Streamable HTTP at `/mcp` on
the real app (real MiniLM, faiss and BM25 over one index of two collections, API keys limited
to one each), and `answer-service mcp` over stdio in front of that running service. Answers are
quotes (no model); the fake SGLang only makes the service ready."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult, TextContent

from answer_service.runtime.keys.auth import ApiKey, digest, write_api_keys
from answer_service.runtime.settings import Settings
from retrieval.embedder import EmbedderConfig, SentenceTransformerEmbedder
from retrieval.index.builder import build_index
from retrieval.index.sync import sync_index
from retrieval.ingest.source import IngestOptions, open_source
from tests.fakes.fake_sglang import FakeSGLangState, create_fake_sglang
from tests.integration.conftest import ServiceFactory
from tests.support import REPO_ROOT, serve_in_thread

pytestmark = pytest.mark.integration

ALPHA_KEY = "ask_mcp-alpha-key"
BETA_KEY = "ask_mcp-beta-key"
SLOW_KEY = "ask_mcp-slow-key"  # one request, then one every 10 s
QUESTION = "How many autovacuum workers should a busy server run?"


def _note(topic: str, n: int) -> str:
    return (
        f"# {topic} note {n}\n\n## Workers\n\nThe autovacuum launcher starts workers; a busy "
        f"server with many tables runs more autovacuum workers, each vacuum pass freeing dead "
        f"rows. Note {n} of the {topic} handbook.\n"
    )


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two collections as a user makes them: a build of one folder, a sync of the other."""
    tmp = tmp_path_factory.mktemp("mcp")
    for topic in ("alpha", "beta"):
        (tmp / topic).mkdir()
        for n in range(4):
            (tmp / topic / f"note{n}.md").write_text(_note(topic, n))
    model = Settings.model_fields["embedder_model"].default
    embedder = SentenceTransformerEmbedder(EmbedderConfig(model=model, device="cpu"))
    alpha = open_source([tmp / "alpha"], IngestOptions(collection="alpha"))
    build_index(alpha, tmp / "index", embedder, progress=False)
    beta = IngestOptions(collection="beta")
    sync_index([tmp / "beta"], tmp / "index", embedder, options=beta, progress=False)
    return tmp / "index"


@pytest.fixture(scope="module")
def keys_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("mcp-keys") / "keys.json"
    limits: dict[str, Any] = {"rate_per_s": 100.0, "burst": 100}
    write_api_keys(
        path,
        [
            ApiKey("alpha", digest(ALPHA_KEY), "standard", **limits,
                   collections=frozenset({"alpha"})),
            ApiKey("beta", digest(BETA_KEY), "standard", **limits,
                   collections=frozenset({"beta"})),
            ApiKey("slow", digest(SLOW_KEY), "standard", rate_per_s=0.1, burst=1,
                   collections=frozenset({"alpha"})),
        ],
    )  # fmt: skip
    return path


@pytest.fixture(scope="module")
def url(
    service: ServiceFactory, index_dir: Path, keys_file: Path, chatml_tokenizer_dir: Path
) -> Iterator[str]:
    state = FakeSGLangState(model_path=str(chatml_tokenizer_dir))
    with (
        serve_in_thread(create_fake_sglang(state)) as sglang,
        service(
            index_dir=index_dir, sglang_url=sglang, api_keys_file=keys_file, mode="quote"
        ) as base,
    ):
        yield base


@asynccontextmanager
async def _mcp(
    url: str, key: str | None, mode: str = "auto", tier: str | None = None
) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if tier is not None:
        headers["X-Tenant-Tier"] = tier
    async with (
        httpx2.AsyncClient(headers=headers, timeout=60) as http,
        Client(streamable_http_client(f"{url}/mcp", http_client=http), mode=mode) as client,
    ):
        yield client


def _data(result: CallToolResult) -> dict[str, Any]:
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return result.structured_content


def _error(result: CallToolResult) -> str:
    assert result.is_error, result.structured_content
    (content,) = result.content
    assert isinstance(content, TextContent)
    return content.text


def _collection(passage_id: str) -> str:
    return passage_id.split("/", 1)[0]


async def test_lists_the_three_tools_with_their_arguments(url: str) -> None:
    async with _mcp(url, ALPHA_KEY) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert set(tools) == {"search", "answer", "get_passage"}
    assert set(tools["search"].input_schema["properties"]) == {"query", "top_k", "filters"}
    assert set(tools["answer"].input_schema["properties"]) == {"query", "budget_ms", "filters"}
    assert tools["get_passage"].input_schema["required"] == ["id"]
    assert all(tool.output_schema for tool in tools.values())
    # A client of the protocol's handshake era (initialize first) gets the same tools.
    async with _mcp(url, ALPHA_KEY, mode="legacy") as client:
        assert {tool.name for tool in (await client.list_tools()).tools} == set(tools)
        found = _data(await client.call_tool("search", {"query": QUESTION, "top_k": 1}))
        assert len(found["passages"]) == 1


async def test_search_gives_passages_with_ids_titles_and_urls_that_resolve(url: str) -> None:
    async with _mcp(url, ALPHA_KEY) as client:
        found = _data(await client.call_tool("search", {"query": QUESTION, "top_k": 3}))
    assert found["mode"] == "hybrid"
    passages = found["passages"]
    assert len(passages) == 3
    for passage in passages:
        assert passage["title"].startswith("alpha note")
        assert passage["url"].startswith(f"{url}/v1/passages/alpha%2F")
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {ALPHA_KEY}"}) as http:
        fetched = await http.get(passages[0]["url"])
    assert fetched.json()["id"] == passages[0]["id"]


async def test_answer_is_cited_within_its_budget(url: str) -> None:
    async with _mcp(url, ALPHA_KEY) as client:
        answer = _data(await client.call_tool("answer", {"query": QUESTION, "budget_ms": 5000}))
    assert answer["form"] == "quote"
    assert answer["within_budget"]
    # Where the span head is sure of a short answer, it is words of the quoted answer.
    short = answer["short_answer"]
    assert short is None or (short and short in answer["answer"]), short
    assert answer["citations"]
    numbers = {source["number"] for source in answer["sources"]}
    for citation in answer["citations"]:
        assert set(citation["sources"]) <= numbers
    cited = {n for c in answer["citations"] if c["supported"] for n in c["sources"]}
    assert cited
    assert all(f"[{n}]" in answer["answer"] for n in cited)
    assert {_collection(source["id"]) for source in answer["sources"]} == {"alpha"}
    assert all(source["url"].startswith(f"{url}/v1/passages/") for source in answer["sources"])


async def test_get_passage_by_the_id_search_gave(url: str) -> None:
    async with _mcp(url, ALPHA_KEY) as client:
        hit = _data(await client.call_tool("search", {"query": QUESTION, "top_k": 1}))
        first = hit["passages"][0]
        passage = _data(await client.call_tool("get_passage", {"id": first["id"]}))
        assert passage["text"] == first["text"]
        assert passage["url"] == first["url"]
        missing = _error(await client.call_tool("get_passage", {"id": "alpha/none.md#0"}))
    assert missing.endswith("404 not_found: the index holds no passage 'alpha/none.md#0'")


async def test_without_a_valid_key_the_endpoint_answers_401(url: str) -> None:
    async with httpx.AsyncClient() as http:
        for key in (None, "ask_not-a-key"):
            response = await http.post(
                f"{url}/mcp",
                json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                headers={"Authorization": f"Bearer {key}"} if key else {},
            )
            assert response.status_code == 401
            assert response.headers["www-authenticate"] == "Bearer"
    # The SDK's client does not connect (it reports the 401 as a JSON-RPC internal error).
    with pytest.raises(ExceptionGroup) as raised:
        async with _mcp(url, None) as client:
            await client.list_tools()
    assert any(isinstance(exc, MCPError) for exc in _flat(raised.value)), raised.value


def _flat(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _flat(inner)]
    return [exc]


async def test_a_refused_call_is_a_tool_error_and_the_session_goes_on(url: str) -> None:
    async with _mcp(url, ALPHA_KEY) as client:
        refused = _error(
            await client.call_tool(
                "search", {"query": QUESTION, "filters": {"collection": ["alpha", "beta"]}}
            )
        )
        assert "403" in refused
        assert "may not read collection(s) ['beta']" in refused
        too_many = _error(await client.call_tool("search", {"query": QUESTION, "top_k": 10_000}))
        assert "422 invalid_request: `top_k` is 10000; the limit is 200" in too_many
        for bad in ({"query": ""}, {"query": QUESTION, "top_k": 0}, {"top_k": 3}):
            assert "validation error" in _error(await client.call_tool("search", bad))
        unknown = {"query": QUESTION, "filters": {"colour": "red"}}
        assert "colour" in _error(await client.call_tool("answer", unknown))
        # The same session still answers.
        assert _data(await client.call_tool("search", {"query": QUESTION, "top_k": 1}))


async def test_the_key_s_rate_and_tier_apply_to_each_tool_call(url: str) -> None:
    async with _mcp(url, SLOW_KEY) as client:
        # `/mcp` itself counts nothing: the first tool call is the key's one request.
        assert _data(await client.call_tool("search", {"query": QUESTION, "top_k": 1}))
        limited = _error(await client.call_tool("answer", {"query": QUESTION}))
        assert "429 rate_limited: key 'slow' is over its rate" in limited
        assert "(retry after" in limited
    async with _mcp(url, ALPHA_KEY, tier="premium") as client:
        refused = _error(await client.call_tool("answer", {"query": QUESTION}))
    assert "403 forbidden: key 'alpha' is for tier 'standard', not 'premium'" in refused


async def test_each_key_sees_only_its_own_collection(url: str) -> None:
    ids: dict[str, str] = {}
    for key, collection in ((ALPHA_KEY, "alpha"), (BETA_KEY, "beta")):
        async with _mcp(url, key) as client:
            found = _data(await client.call_tool("search", {"query": QUESTION, "top_k": 8}))
            assert {_collection(p["id"]) for p in found["passages"]} == {collection}
            answer = _data(await client.call_tool("answer", {"query": QUESTION}))
            assert {_collection(s["id"]) for s in answer["sources"]} == {collection}
            ids[collection] = found["passages"][0]["id"]
    async with _mcp(url, ALPHA_KEY) as client:
        hidden = _error(await client.call_tool("get_passage", {"id": ids["beta"]}))
        assert "404 not_found" in hidden
        narrowed = await client.call_tool(
            "search", {"query": QUESTION, "filters": {"path_prefix": "alpha/note1"}}
        )
        assert {p["doc_id"] for p in _data(narrowed)["passages"]} == {"alpha/note1.md"}


async def test_an_abandoned_answer_call_aborts_its_generation(
    service: ServiceFactory, index_dir: Path, chatml_tokenizer_dir: Path
) -> None:
    """A client that gives up on `answer` closes its request; the SDK cancels the tool, the
    cancellation reaches the in-process /v1/answer, and SGLang is told to abort, as when a
    client leaves /v1/answer itself (test_api_failures.py)."""
    state = FakeSGLangState(
        model_path=str(chatml_tokenizer_dir), mode="slow"
    )  # 2 tokens, then silence
    with (
        serve_in_thread(create_fake_sglang(state)) as sglang,
        service(index_dir=index_dir, sglang_url=sglang, mode="passages") as base,
    ):
        async with _mcp(base, None) as client:
            call = client.call_tool("answer", {"query": QUESTION, "budget_ms": 10_000})
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(call, 5.0)
        assert state.requests, "the answer reached SGLang"
        assert await asyncio.to_thread(state.last_aborted_within, 5.0)


def _stdio(url: str, key: str | None) -> StdioServerParameters:
    """`answer-service mcp --url URL`, run from this checkout, the key from the environment."""
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "answer_service.cli.main", "mcp", "--url", url],
        env={"ANSWER_API_KEY": key} if key else {},
        cwd=REPO_ROOT,
    )


async def test_the_stdio_command_proxies_the_running_service_with_its_key(url: str) -> None:
    async with Client(_stdio(url, BETA_KEY)) as client:
        tools = {tool.name for tool in (await client.list_tools()).tools}
        assert tools == {"search", "answer", "get_passage"}
        found = _data(await client.call_tool("search", {"query": QUESTION, "top_k": 2}))
        assert {_collection(p["id"]) for p in found["passages"]} == {"beta"}
        assert found["passages"][0]["url"].startswith(f"{url}/v1/passages/beta%2F")
        answer = _data(await client.call_tool("answer", {"query": QUESTION}))
        assert answer["citations"]
        passage = _data(await client.call_tool("get_passage", {"id": found["passages"][0]["id"]}))
        assert passage["id"] == found["passages"][0]["id"]
    async with Client(_stdio(url, None)) as client:
        refused = _error(await client.call_tool("search", {"query": QUESTION}))
    assert "401 unauthorized: an API key is required" in refused
