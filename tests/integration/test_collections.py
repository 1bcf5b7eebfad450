"""Collections per key and search filters, from outside: one index of two collections whose
documents share words (real MiniLM, faiss and BM25), served over real HTTP with two keys, each
limited to one collection. No route (retrieve, answer and its cache, passages, traces, chat,
Responses, the dashboard) ever shows a key a passage of the other collection; a filtered search
comes back with top_k hits of the allowed set. Quotes need no model; the fake SGLang only makes
the service ready."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import openai
import pytest

from answer_service.runtime.keys.auth import ApiKey, digest, write_api_keys
from answer_service.runtime.settings import Settings
from retrieval.embedder import EmbedderConfig, SentenceTransformerEmbedder
from retrieval.index.builder import build_index
from retrieval.index.sync import sync_index
from retrieval.ingest.source import IngestOptions, open_source
from tests.fakes.fake_sglang import FakeSGLangState, create_fake_sglang
from tests.integration.conftest import ServiceFactory
from tests.support import serve_in_thread

pytestmark = pytest.mark.integration

ALPHA_KEY = "ask_alpha-team-key"
BETA_KEY = "ask_beta-team-key"
ADMIN_KEY = "ask_admin-all-key"  # admin, every collection
QUESTION = "How many autovacuum workers should a busy server run?"
TOP_K = 5


def _page(topic: str, n: int, emphasis: str) -> str:
    return (
        f"# {topic} note {n}\n\n## Workers\n\n{emphasis} The autovacuum launcher starts "
        f"workers; a busy server with many tables runs more autovacuum workers, each vacuum "
        f"pass freeing dead rows. Note {n} of the {topic} handbook.\n\n## Other\n\n"
        f"Checkpoints and the {topic} write-ahead log are described in note {n}.\n"
    )


def _write_collections(root: Path) -> tuple[Path, Path]:
    """alpha: six notes in two folders (tags from the folders, one from front matter); beta:
    six notes that match the question harder, so an unfiltered search ranks beta first."""
    alpha, beta = root / "alpha", root / "beta"
    for n in range(6):
        folder = alpha / ("ops" if n % 2 else "dev")
        folder.mkdir(parents=True, exist_ok=True)
        text = _page("alpha", n, "Vacuum settings matter.")
        if n == 0:
            text = "---\ntags: [tuning, ops]\n---\n" + text
        (folder / f"note{n}.md").write_text(text)
    beta.mkdir()
    for n in range(6):
        loud = "Autovacuum workers: set autovacuum_max_workers for a busy server. " * 2
        (beta / f"note{n}.md").write_text(_page("beta", n, loud))
    return alpha, beta


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("collections")
    alpha, beta = _write_collections(tmp / "docs")
    model = Settings.model_fields["embedder_model"].default
    embedder = SentenceTransformerEmbedder(EmbedderConfig(model=model, device="cpu"))
    # Two collections in one index as a user makes them: a build of one folder, a sync of the
    # other into its own collection.
    alpha_source = open_source([alpha], IngestOptions(collection="alpha"))
    build_index(alpha_source, tmp / "index", embedder, progress=False)
    sync_index(
        [beta], tmp / "index", embedder, options=IngestOptions(collection="beta"), progress=False
    )
    return tmp / "index"


@pytest.fixture(scope="module")
def keys_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("keys") / "keys.json"
    limits: dict[str, Any] = {"rate_per_s": 100.0, "burst": 100}
    write_api_keys(
        path,
        [
            ApiKey("alpha-team", digest(ALPHA_KEY), "standard", **limits,
                   collections=frozenset({"alpha"})),
            ApiKey("beta-team", digest(BETA_KEY), "standard", **limits,
                   collections=frozenset({"beta"})),
            ApiKey("ops", digest(ADMIN_KEY), "standard", **limits, admin=True),
        ],
    )  # fmt: skip
    return path


@pytest.fixture(scope="module")
def sglang(chatml_tokenizer_dir: Path) -> Iterator[str]:
    state = FakeSGLangState(model_path=str(chatml_tokenizer_dir))
    with serve_in_thread(create_fake_sglang(state)) as url:
        yield url


@pytest.fixture(scope="module")
def url(service: ServiceFactory, index_dir: Path, keys_file: Path, sglang: str) -> Iterator[str]:
    settings = {"api_keys_file": keys_file, "answer_cache_ttl_s": 600}  # the cache is a side door
    with service(index_dir=index_dir, sglang_url=sglang, **settings) as base:
        yield base


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _retrieve(url: str, key: str, **body: Any) -> httpx.Response:
    body = {"query": QUESTION, "top_k": TOP_K, **body}
    return httpx.post(f"{url}/v1/retrieve", json=body, headers=_auth(key), timeout=60)


def _ids(passages: list[dict[str, Any]]) -> list[str]:
    return [p["id"] for p in passages]


def _collection_of(passage_id: str) -> str:
    return passage_id.split("/", 1)[0]


QUOTE: dict[str, Any] = {"answer_mode": "quote", "top_k": 3, "ttft_budget_ms": 10_000}


def test_each_key_retrieves_a_full_top_k_of_its_own_collection(url: str) -> None:
    everything = _ids(_retrieve(url, ADMIN_KEY).json()["passages"])
    assert _collection_of(everything[0]) == "beta", everything  # beta matches harder
    for key, collection in ((ALPHA_KEY, "alpha"), (BETA_KEY, "beta")):
        for mode in ("dense", "lexical", "hybrid"):
            found = _ids(_retrieve(url, key, mode=mode).json()["passages"])
            assert len(found) == TOP_K, (mode, found)
            assert {_collection_of(i) for i in found} == {collection}, (mode, found)


def test_filters_narrow_within_what_the_key_reads(url: str) -> None:
    alpha = _ids(_retrieve(url, ADMIN_KEY, filters={"collection": "alpha"}).json()["passages"])
    assert len(alpha) == TOP_K
    assert {_collection_of(i) for i in alpha} == {"alpha"}
    both = _retrieve(url, ADMIN_KEY, filters={"collection": ["alpha", "beta"]}).json()
    assert _ids(both["passages"]) == _ids(_retrieve(url, ADMIN_KEY).json()["passages"])
    ops = _ids(_retrieve(url, ALPHA_KEY, filters={"path_prefix": "alpha/ops/"}).json()["passages"])
    assert len(ops) == TOP_K
    assert all(i.startswith("alpha/ops/") for i in ops)
    # Tags: the folders below the folder given, or the front matter's.
    tagged = _retrieve(url, ADMIN_KEY, top_k=20, filters={"tags": ["tuning", "ops"]}).json()
    assert {p["doc_id"] for p in tagged["passages"]} == {"alpha/dev/note0.md"}
    dev = _retrieve(url, ALPHA_KEY, top_k=20, filters={"tags": ["dev"]}).json()["passages"]
    assert {p["doc_id"] for p in dev} == {"alpha/dev/note2.md", "alpha/dev/note4.md"}


def test_naming_a_collection_the_key_may_not_read_is_403(url: str) -> None:
    refused = _retrieve(url, ALPHA_KEY, filters={"collection": ["alpha", "beta"]})
    assert refused.status_code == 403
    assert "may not read collection(s) ['beta']" in refused.json()["error"]["message"]
    answer = httpx.post(
        f"{url}/v1/answer",
        json={"query": QUESTION, "stream": False, "filters": {"collection": "beta"}, **QUOTE},
        headers=_auth(ALPHA_KEY),
        timeout=60,
    )
    assert answer.status_code == 403


@pytest.mark.parametrize(
    "filters",
    [
        {"collection": 5},
        {"collection": []},
        {"collection": ""},
        {"colection": "alpha"},
        {"tags": "ops"},
        {"tags": [1]},
        {"path_prefix": ""},
        "alpha",
    ],
)
def test_a_filter_of_the_wrong_shape_is_422(url: str, filters: Any) -> None:
    response = _retrieve(url, ADMIN_KEY, filters=filters)
    assert response.status_code == 422, response.text
    assert "filters" in response.json()["error"]["message"]


def _answer(url: str, key: str, **extra: Any) -> dict[str, Any]:
    body = {"query": QUESTION, "stream": False, **QUOTE, **extra}
    response = httpx.post(f"{url}/v1/answer", json=body, headers=_auth(key), timeout=60)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def test_answers_and_their_cache_keep_to_the_key_s_collection(url: str) -> None:
    for key, collection, other in ((ALPHA_KEY, "alpha", "beta"), (BETA_KEY, "beta", "alpha")):
        answer = _answer(url, key)
        assert answer["done"]["form"] == "quote", answer["done"]
        assert {_collection_of(s["id"]) for s in answer["sources"]} == {collection}
        assert f"{other} handbook" not in answer["answer"]
    # A generated answer is cached: the same question from the other key is not served it.
    generated = {"answer_mode": "passages"}
    first = _answer(url, ALPHA_KEY, **generated)
    assert first["done"]["form"] == "passages", first["done"]
    assert _answer(url, ALPHA_KEY, **generated)["done"]["from_cache"]
    for _ in range(2):
        beta = _answer(url, BETA_KEY, **generated)
        assert {_collection_of(s["id"]) for s in beta["sources"]} == {"beta"}
    assert beta["done"]["from_cache"]  # its own entry, the second time
    narrowed = _answer(url, ALPHA_KEY, filters={"path_prefix": "alpha/ops/"}, **generated)
    assert not narrowed["done"]["from_cache"]
    assert all(s["id"].startswith("alpha/ops/") for s in narrowed["sources"])
    streamed = httpx.post(
        f"{url}/v1/answer",
        json={"query": QUESTION, **QUOTE, **generated},
        headers=_auth(BETA_KEY),
        timeout=60,
    )
    assert "alpha/" not in streamed.text


def test_a_passage_of_another_collection_is_not_found(url: str) -> None:
    beta_id = _ids(_retrieve(url, BETA_KEY).json()["passages"])[0]

    def fetch(passage_id: str, key: str) -> httpx.Response:
        path = f"{url}/v1/passages/{quote(passage_id, safe='')}"
        return httpx.get(path, headers=_auth(key), timeout=10)

    assert fetch(beta_id, BETA_KEY).status_code == 200
    hidden, missing = fetch(beta_id, ALPHA_KEY), fetch("beta/nothing.md#0", ALPHA_KEY)
    assert hidden.status_code == missing.status_code == 404
    assert hidden.json()["error"]["message"].replace(beta_id, "ID") == missing.json()["error"][
        "message"
    ].replace("beta/nothing.md#0", "ID")


def _client(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=60)


def test_chat_and_responses_cite_only_the_key_s_collection(url: str) -> None:
    extra = {"answer_mode": "quote", "top_k": 3}
    for key, other in ((ALPHA_KEY, "beta"), (BETA_KEY, "alpha")):
        client = _client(url, key)
        completion = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": QUESTION}], extra_body=extra
        )
        dumped = completion.model_dump_json()
        assert (completion.model_extra or {})["citations"]
        assert f"{other}%2F" not in dumped
        assert f"{other}/" not in dumped
        response = client.responses.create(model="m", input=QUESTION, extra_body=extra)
        dumped = response.model_dump_json()
        assert "url_citation" in dumped
        assert f"{other}%2F" not in dumped
        assert f"{other}/" not in dumped
    with pytest.raises(openai.PermissionDeniedError):
        _client(url, ALPHA_KEY).chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": QUESTION}],
            extra_body={**extra, "filters": {"collection": "beta"}},
        )


def test_traces_and_the_dashboard_show_no_other_collection(url: str) -> None:
    _answer(url, ALPHA_KEY, top_k=4)
    _answer(url, BETA_KEY, top_k=4)
    for key, other in ((ALPHA_KEY, "beta"), (BETA_KEY, "alpha")):
        traces = httpx.get(f"{url}/v1/traces", headers=_auth(key), timeout=10).json()
        assert traces
        assert f"{other}/" not in json.dumps(traces)
    everyone = httpx.get(f"{url}/v1/traces", headers=_auth(ADMIN_KEY), timeout=10).json()
    assert len(everyone) > len(httpx.get(f"{url}/v1/traces", headers=_auth(ALPHA_KEY)).json())
    snapshot = httpx.get(f"{url}/dashboard/snapshot", timeout=10).text
    assert "alpha/" not in snapshot
    assert "beta/" not in snapshot


def test_without_keys_everything_is_readable_and_filters_still_work(
    service: ServiceFactory, index_dir: Path, sglang: str
) -> None:
    with service(index_dir=index_dir, sglang_url=sglang) as base:
        body = {"query": QUESTION, "top_k": TOP_K}
        everything = httpx.post(f"{base}/v1/retrieve", json=body, timeout=60).json()["passages"]
        assert {_collection_of(i) for i in _ids(everything)} >= {"beta"}
        alpha = httpx.post(
            f"{base}/v1/retrieve", json={**body, "filters": {"collection": "alpha"}}, timeout=60
        ).json()["passages"]
        assert len(alpha) == TOP_K
        assert {_collection_of(i) for i in _ids(alpha)} == {"alpha"}
        fetched = httpx.get(f"{base}/v1/passages/{quote(everything[0]['id'], safe='')}")
        assert fetched.status_code == 200
