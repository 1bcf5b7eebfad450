"""The search page at `/` in a real headless browser (Debian's chromium, driven by playwright),
against the service over real HTTP with the real SQuAD index and the fake SGLang (whose words are
known, so a sentence is cited and a long answer can be stopped): tokens arrive, sources and
citation markers show, a marker shows its passage, a follow-up is sent with the conversation
before it and searched with it, Stop aborts the request on SGLang, a question
the corpus cannot answer gets "I do not know", and with API keys a 401 asks for the key once and
a 429 says when to come back. Screenshots go to test-artifacts/page/; `PAGE_SCREENSHOTS=docs/page`
refreshes the ones the docs show."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from answer_service.runtime.keys.auth import ApiKey, digest, write_api_keys
from tests.fakes.fake_sglang import FakeSGLangState, create_fake_sglang
from tests.integration.conftest import ServiceFactory
from tests.support import serve_in_thread

CHROMIUM = Path("/usr/bin/chromium")
SHOTS = Path(os.environ.get("PAGE_SCREENSHOTS", "test-artifacts/page"))
QUESTION = "Which NFL team represented the AFC at Super Bowl 50?"
NONSENSE = "How many xylophones does a quasar emit per fortnight?"
ANSWER = (
    "The American Football Conference champion Denver Broncos",
    " defeated the National Football Conference champion Carolina Panthers",
    " to earn their third Super Bowl title. Bananas grow",
    " on purple trees in Antarctica.",
)
LONG_ANSWER = tuple(f" word{n}" for n in range(400))
KEY = "ask_page-test-key"

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not CHROMIUM.exists(), reason="needs Debian's chromium (make test installs it)"
    ),
]


@pytest.fixture(scope="module")
def sglang(chatml_tokenizer_dir: Path) -> Iterator[tuple[str, FakeSGLangState]]:
    state = FakeSGLangState(model_path=str(chatml_tokenizer_dir), tokens=ANSWER)
    state.token_delay_s = 0.3  # slow enough to see the answer arrive in pieces
    with serve_in_thread(create_fake_sglang(state)) as url:
        yield url, state


@pytest.fixture(scope="module")
def url(service: ServiceFactory, sglang: tuple[str, FakeSGLangState]) -> Iterator[str]:
    # The service's own abstention threshold (the test defaults turn it off).
    with service(sglang_url=sglang[0], abstain_below=None) as base:
        yield base


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=["--no-sandbox", "--disable-gpu"]
        )
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1100, "height": 720})
    opened = context.new_page()
    problems: list[str] = []
    opened.on("pageerror", lambda error: problems.append(f"page: {error}"))
    yield opened
    context.close()
    assert problems == []


def _ask(page: Page, question: str) -> None:
    page.fill("#question", question)
    page.click("#ask-button")


def _shot(page: Page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"{name}.png"
    page.screenshot(path=str(path))
    assert path.stat().st_size < 200_000


def test_an_answer_streams_with_its_sources_citations_and_times(url: str, page: Page) -> None:
    page.goto(url)
    assert page.title().endswith("search")
    _ask(page, QUESTION)
    # Tokens arrive while the answer still streams: a first piece before the last.
    page.wait_for_function(
        "document.body.dataset.state === 'streaming'"
        " && document.getElementById('answer').textContent.includes('Denver Broncos')",
        timeout=30_000,
    )
    assert "Antarctica" not in page.locator("#answer").inner_text()
    page.wait_for_function("document.body.dataset.state === 'done'", timeout=30_000)
    answer = page.locator("#answer").inner_text()
    assert "Super Bowl title." in answer
    assert "Antarctica." in answer
    # The sources, with titles; the supported sentence's marker names one of them.
    assert page.locator("#sources li").count() >= 1
    assert page.locator("#sources .source-title").first.inner_text().strip()
    markers = page.locator("#answer .cite")
    assert markers.count() == 1
    number = markers.first.get_attribute("data-source")
    assert page.locator(f"#sources li[data-number='{number}']").count() == 1
    assert page.locator("#answer .unsupported").count() == 1  # the bananas
    # Each stage against the budget, and the first token's time.
    assert page.locator("#timings tr[data-stage='embed']").count() == 1
    assert page.locator("#timings tr[data-stage='first token']").count() == 1
    assert "within budget" in page.locator("#timings .ttft").inner_text()

    markers.first.hover()
    popover = page.locator("#popover")
    popover.wait_for(state="visible")
    title = page.locator(f"#sources li[data-number='{number}'] .source-title").inner_text()
    assert title in popover.inner_text()
    assert "null" not in popover.inner_text()  # a source without a URL shows no link
    _shot(page, "citation")
    markers.first.click()  # pins it and loads the whole passage
    page.wait_for_selector("#popover .pop-text.whole")
    assert "Denver Broncos" in page.locator("#popover .pop-text").inner_text()
    page.keyboard.press("Escape")
    assert popover.is_hidden()
    _shot(page, "answer")


def test_a_follow_up_continues_the_conversation(url: str, page: Page) -> None:
    page.goto(url)
    _ask(page, QUESTION)
    page.wait_for_function("document.body.dataset.state === 'done'", timeout=30_000)
    assert page.locator("#searched").is_hidden()  # a first question is searched as asked
    with page.expect_request("**/v1/answer") as asked:
        page.fill("#follow-up-question", "Who did they beat?")
        page.click("#follow-up button[type=submit]")
    history = asked.value.post_data_json["history"]
    assert [turn["role"] for turn in history] == ["user", "assistant"]
    assert history[0]["content"] == QUESTION
    assert "Denver Broncos" in history[1]["content"]
    page.wait_for_function("document.body.dataset.state === 'done'", timeout=30_000)
    searched = page.locator("#searched").inner_text()
    assert searched.startswith("Searched as: Who did they beat?")
    assert "NFL" in searched  # the earlier question's rarest words
    _shot(page, "follow-up")


def test_stop_cancels_the_request_on_sglang(
    url: str, page: Page, sglang: tuple[str, FakeSGLangState]
) -> None:
    state = sglang[1]
    state.tokens, state.token_delay_s = LONG_ANSWER, 0.05
    try:
        page.goto(url)
        _ask(page, QUESTION)
        page.wait_for_function(
            "document.getElementById('answer').textContent.includes('word5')", timeout=30_000
        )
        page.click("#stop")
        page.wait_for_function("document.body.dataset.state === 'stopped'", timeout=10_000)
        assert state.last_aborted_within(10.0), "the service did not abort SGLang's request"
        assert "word399" not in page.locator("#answer").inner_text()
        assert page.locator("#stop").is_hidden()
        _shot(page, "stopped")
    finally:
        state.tokens, state.token_delay_s = ANSWER, 0.3


def test_a_question_the_corpus_cannot_answer_gets_i_do_not_know(url: str, page: Page) -> None:
    page.goto(url)
    _ask(page, NONSENSE)
    page.wait_for_function("document.body.dataset.state === 'abstained'", timeout=30_000)
    assert page.locator("#answer").get_attribute("data-form") == "abstain"
    assert page.locator("#answer").inner_text().startswith("I do not know")
    assert page.locator("#abstain-note").is_visible()
    assert page.locator("#sources li").count() >= 1  # the closest sources are listed
    _shot(page, "abstained")


@pytest.fixture(scope="module")
def keyed_url(
    service: ServiceFactory,
    sglang: tuple[str, FakeSGLangState],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[str]:
    keys = tmp_path_factory.mktemp("keys") / "keys.json"
    # Two answers at once, then one a minute: the third question is refused with Retry-After.
    write_api_keys(keys, [ApiKey("page", digest(KEY), "standard", rate_per_s=1 / 60, burst=2)])
    with service(sglang_url=sglang[0], api_keys_file=keys) as base:
        yield base


def test_the_key_is_asked_once_and_a_429_says_when_to_come_back(keyed_url: str, page: Page) -> None:
    page.goto(keyed_url)
    _ask(page, QUESTION)
    page.wait_for_function("document.body.dataset.state === 'refused'", timeout=30_000)
    assert page.locator("#key-form").is_visible()
    _shot(page, "key")
    page.fill("#key", KEY)
    page.click("#key-form button[type=submit]")  # saves it and asks again
    page.wait_for_function("document.body.dataset.state === 'done'", timeout=30_000)
    assert page.evaluate("localStorage.getItem('answer-service.api-key')") == KEY
    page.reload()  # the key is kept: no prompt this time
    _ask(page, QUESTION)
    page.wait_for_function("document.body.dataset.state === 'done'", timeout=30_000)
    assert page.locator("#key-form").is_hidden()
    _ask(page, QUESTION)
    page.wait_for_function("document.body.dataset.state === 'refused'", timeout=30_000)
    assert page.locator("#status").get_attribute("data-status") == "429"
    assert "Try again in" in page.locator("#status").inner_text()
