"""API keys, rate limits, open-answer limits, body limits and CORS over real HTTP, with a real
Redis shared by two replicas (and a dead one), answering through the real tiny SGLang."""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from answer_service.runtime.keys.auth import ApiKey, digest, write_api_keys
from tests.integration.conftest import ServiceFactory
from tests.support import free_port, parse_sse

pytestmark = [pytest.mark.integration, pytest.mark.sglang]

REDIS_URL = "redis://127.0.0.1:6379/0"
QUESTION = "Which NFL team represented the AFC at Super Bowl 50?"
PREMIUM = "ask_premium-test-key"
SLOW = "ask_slow-test-key"
ONE_AT_A_TIME = "ask_single-stream-key"


@pytest.fixture(scope="module")
def keys_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("keys") / "keys.json"
    write_api_keys(
        path,
        [
            ApiKey("premium-team", digest(PREMIUM), "premium", rate_per_s=100, burst=100),
            ApiKey("slow-team", digest(SLOW), "standard", rate_per_s=0.2, burst=2),
            ApiKey("single", digest(ONE_AT_A_TIME), "standard", max_streams=1),
        ],
    )
    return path


@pytest.fixture(scope="module")
def settings(keys_file: Path) -> dict[str, Any]:
    return {
        "api_keys_file": keys_file,
        "redis_url": REDIS_URL,
        "redis_prefix": f"test-{uuid.uuid4().hex[:8]}:",
        "cors_origins": ["https://app.example"],
    }


@pytest.fixture(scope="module")
def url(tiny_service: ServiceFactory, settings: dict[str, Any]) -> Iterator[str]:
    with tiny_service(**settings) as base:
        yield base


BODY = {"query": QUESTION, "ttft_budget_ms": 10_000, "top_k": 2}


def _ask(url: str, key: str | None = None, **headers: str) -> httpx.Response:
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    return httpx.post(f"{url}/v1/answer", json=BODY, headers=headers, timeout=30)


def _status_then_leave(url: str, key: str) -> int:
    """The status of an answer asked for and left at once (the service aborts it)."""
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.stream("POST", f"{url}/v1/answer", json=BODY, headers=headers, timeout=30) as r:
        return r.status_code


def test_no_key_or_a_wrong_one_is_401(url: str) -> None:
    missing = _ask(url)
    assert missing.status_code == 401
    assert missing.headers["www-authenticate"] == "Bearer"
    assert missing.json()["error"]["code"] == "unauthorized"
    assert "API key is required" in missing.json()["error"]["message"]
    wrong = _ask(url, "ask_not-a-key")
    assert wrong.status_code == 401
    assert wrong.json()["error"]["message"] == "the API key is not valid"
    assert httpx.get(f"{url}/healthz", timeout=5).status_code == 200  # open


def test_the_key_sets_the_tier_and_another_tier_is_403(url: str) -> None:
    answered = _ask(url, PREMIUM)
    assert answered.status_code == 200, answered.text
    plan = parse_sse(answered.text)[0]
    assert plan.event == "plan"
    assert plan.data["tier"] == "premium"
    by_header = httpx.post(
        f"{url}/v1/answer",
        json={"query": QUESTION, "ttft_budget_ms": 10_000},
        headers={"X-API-Key": PREMIUM},
        timeout=30,
    )
    assert by_header.status_code == 200
    other = _ask(url, PREMIUM, **{"X-Tenant-Tier": "standard"})
    assert other.status_code == 403
    assert other.json()["error"]["code"] == "forbidden"


def test_the_openai_client_sends_its_key(url: str) -> None:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=PREMIUM, max_retries=0, timeout=30)
    completion = client.chat.completions.create(
        model="any", messages=[{"role": "user", "content": QUESTION}]
    )
    assert completion.choices[0].message.content
    refused = openai.OpenAI(base_url=f"{url}/v1", api_key="ask_nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        refused.chat.completions.create(model="any", messages=[{"role": "user", "content": "q"}])


def test_replicas_share_one_rate_limit_through_redis(
    tiny_service: ServiceFactory, url: str, settings: dict[str, Any]
) -> None:
    with tiny_service(**settings) as other:
        assert _ask(url, SLOW).status_code == 200
        assert _ask(other, SLOW).status_code == 200  # the burst of 2 is spent across both
        limited = _ask(url, SLOW)
    assert limited.status_code == 429
    assert limited.json()["error"]["code"] == "rate_limited"
    assert 1 <= int(limited.headers["retry-after"]) <= 5  # a token every 5 s


def test_with_redis_down_each_replica_limits_alone(
    tiny_service: ServiceFactory, settings: dict[str, Any]
) -> None:
    dead = {**settings, "redis_url": f"redis://127.0.0.1:{free_port()}/0"}
    with tiny_service(**dead) as base:
        codes = [_ask(base, SLOW).status_code for _ in range(3)]
        ready = httpx.get(f"{base}/readyz", timeout=10).json()
    assert codes == [200, 200, 429]
    assert ready["redis"].startswith("down: ")


def test_a_key_has_at_most_its_open_answers(
    tiny_service: ServiceFactory, settings: dict[str, Any]
) -> None:
    # Random weights seldom stop: 2,000 tokens keep the first answer open until it is left (the
    # loop guard off: random weights loop, and it would end the answer).
    headers = {"Authorization": f"Bearer {ONE_AT_A_TIME}"}
    with (
        tiny_service(**settings, max_new_tokens=2000, loop_guard=False) as base,
        httpx.stream("POST", f"{base}/v1/answer", json=BODY, headers=headers, timeout=30) as first,
    ):
        assert first.status_code == 200
        lines = first.iter_lines()  # held: a dropped iterator closes the connection
        assert "event: token" in lines  # generating
        second = _ask(base, ONE_AT_A_TIME)
        assert second.status_code == 429
        assert "already has 1 answers open" in second.json()["error"]["message"]
        first.close()  # the client goes away: the answer is aborted and closed
        deadline = time.monotonic() + 10
        while (again := _status_then_leave(base, ONE_AT_A_TIME)) == 429:
            assert time.monotonic() < deadline, "the left answer was never closed"
            time.sleep(0.1)
        assert again == 200


def test_a_body_over_the_limit_is_413(url: str) -> None:
    huge = {"query": "x" * 100_000}
    response = httpx.post(
        f"{url}/v1/answer", json=huge, headers={"Authorization": f"Bearer {PREMIUM}"}
    )
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "payload_too_large"

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it streams
        yield b'{"query": "'
        for _ in range(100):
            yield b"y" * 1000
        yield b'"}'

    streamed = httpx.post(
        f"{url}/v1/answer",
        content=chunks(),
        headers={"Authorization": f"Bearer {PREMIUM}", "content-type": "application/json"},
    )
    assert streamed.status_code == 413


def test_cors_allows_the_configured_origin_only(url: str) -> None:
    preflight = {
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type",
    }
    allowed = httpx.options(
        f"{url}/v1/answer", headers={"Origin": "https://app.example", **preflight}
    )
    assert allowed.status_code == 200
    assert allowed.headers["access-control-allow-origin"] == "https://app.example"
    other = httpx.options(
        f"{url}/v1/answer", headers={"Origin": "https://evil.example", **preflight}
    )
    assert "access-control-allow-origin" not in other.headers


def test_traces_are_scoped_to_the_callers_key(tiny_service: ServiceFactory, tmp_path: Path) -> None:
    """A key holder sees the traces of its own key's requests; an admin key sees all."""
    team_a, team_b, ops = "ask_team-a-key", "ask_team-b-key", "ask_ops-admin-key"
    path = tmp_path / "keys.json"
    path.write_text(
        json.dumps(
            {
                "keys": [
                    {"id": "team-a", "sha256": digest(team_a), "tier": "standard"},
                    {"id": "team-b", "sha256": digest(team_b), "tier": "standard"},
                    {"id": "ops", "sha256": digest(ops), "tier": "standard", "admin": True},
                ]
            }
        )
    )
    with tiny_service(api_keys_file=path) as base:
        asked = [_ask(base, key).status_code for key in (team_a, team_b, team_b)]
        openai_client = openai.OpenAI(base_url=f"{base}/v1", api_key=team_a, max_retries=0)
        openai_client.chat.completions.create(
            model="any", messages=[{"role": "user", "content": QUESTION}]
        )

        def traces(key: str) -> list[dict[str, Any]]:
            response = httpx.get(
                f"{base}/v1/traces", headers={"Authorization": f"Bearer {key}"}, timeout=10
            )
            assert response.status_code == 200, response.text
            found: list[dict[str, Any]] = response.json()
            return found

        seen = {key: traces(key) for key in (team_a, team_b, ops)}
    assert asked == [200, 200, 200]

    def owners(found: list[dict[str, Any]]) -> list[str]:
        return [t["spans"][0]["attributes"].get("answer.key_id", "") for t in found]

    assert owners(seen[team_a]) == ["team-a", "team-a"]
    assert owners(seen[team_b]) == ["team-b", "team-b"]
    assert sorted(owners(seen[ops])) == ["team-a", "team-a", "team-b", "team-b"]


def test_a_revoked_key_is_refused_without_a_restart(
    tiny_service: ServiceFactory,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The key file is read again when it changes: a revoked key stops working within
    seconds, a new one starts; a broken file keeps the keys there were, and says so."""
    stays, goes, comes = "ask_stays-key", "ask_goes-key", "ask_comes-key"
    path = tmp_path / "keys.json"
    kept = ApiKey("stays", digest(stays), "standard")
    write_api_keys(path, [kept, ApiKey("goes", digest(goes), "standard")])

    def status(base: str, key: str) -> int:
        headers = {"Authorization": f"Bearer {key}"}
        return httpx.get(f"{base}/v1/traces", headers=headers, timeout=10).status_code

    def within_5_s(base: str, key: str, wanted: int) -> None:
        deadline = time.monotonic() + 5
        while status(base, key) != wanted:
            assert time.monotonic() < deadline, f"{key} still not {wanted}"
            time.sleep(0.1)

    with (
        caplog.at_level(logging.ERROR, logger="answer_service"),
        tiny_service(api_keys_file=path) as base,
    ):
        assert _ask(base, goes).status_code == 200
        write_api_keys(path, [kept])  # what `answer-service keys revoke --id goes` writes
        within_5_s(base, goes, 401)
        assert _ask(base, goes).status_code == 401
        assert _ask(base, stays).status_code == 200
        path.write_text('{"keys": [{"id": "half-written"')
        time.sleep(2.5)
        assert (status(base, stays), status(base, goes)) == (200, 401)
        write_api_keys(path, [kept, ApiKey("comes", digest(comes), "standard")])
        within_5_s(base, comes, 200)
    assert any("API key file not reloaded" in r.getMessage() for r in caplog.records)
