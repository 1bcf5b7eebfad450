"""`GET /dashboard` in a real headless browser (Debian's chromium, driven by playwright) while
the load generator sends questions to the real stack (SmolLM2 on SGLang): the charts fill with
live data, the answer forms panel shows the model's answers beside a quote, a request opens its
plan and its form, and a screenshot is kept as a test artifact (`test-artifacts/dashboard.png`;
`DASHBOARD_SCREENSHOT` names another path)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import ConsoleMessage, Page, sync_playwright

from generation.server.launch import SGLangServer
from tests.integration.conftest import ServiceFactory
from tests.support import SQUAD_QUESTIONS, post_answer

CHROMIUM = Path("/usr/bin/chromium")
QUESTION = "Which NFL team represented the AFC at Super Bowl 50?"
FORM_NAMES = ("quote", "focused", "passages", "abstain", "sources only", "answer cache")
ARTIFACT = Path(os.environ.get("DASHBOARD_SCREENSHOT", "test-artifacts/dashboard.png"))

pytestmark = [
    pytest.mark.integration,
    pytest.mark.sglang,
    pytest.mark.smollm2,
    pytest.mark.skipif(
        not CHROMIUM.exists(), reason="needs Debian's chromium (make test installs it)"
    ),
]


@pytest.fixture
def url(service: ServiceFactory, smollm2_sglang: SGLangServer) -> Iterator[str]:
    with service(sglang_url=smollm2_sglang.url, max_new_tokens=24) as base:
        yield base


@pytest.fixture
def load(url: str, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`answer-eval load`, open loop, for the length of the test."""
    command = [
        sys.executable,
        "-m",
        "eval.commands.main",
        "load",
        "--url",
        url,
        "--questions",
        str(SQUAD_QUESTIONS),
        "--rate",
        "1.0",
        "--duration",
        "120",
        "--slo-ms",
        "3000",
        "--ttft-budget-ms",
        "3000",
        "--out",
        str(tmp_path / "load.json"),
    ]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    yield process
    process.terminate()
    process.wait(timeout=30)


def _count(page: Page, selector: str) -> int:
    return page.locator(selector).count()


def test_the_dashboard_fills_with_live_data_under_load(
    url: str, load: subprocess.Popen[bytes]
) -> None:
    problems: list[str] = []

    def on_console(message: ConsoleMessage) -> None:
        if message.type == "error":
            problems.append(f"console: {message.text}")

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=["--no-sandbox", "--disable-gpu"]
        )
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 1100})
            page.on("pageerror", lambda error: problems.append(f"page: {error}"))
            page.on("console", on_console)
            page.goto(f"{url}/dashboard")
            # The load asks the model (the tests' ANSWER_MODE passages); a quote is asked apart.
            quote = post_answer(url, {"query": QUESTION, "answer_mode": "quote", "stream": False})
            assert quote.json()["done"]["form"] == "quote"
            # Live: snapshots keep coming and the requests the load generator sends show up.
            page.wait_for_function(
                "Number(document.body.dataset.snapshots || 0) >= 3"
                " && window.__lastSnapshot.requests.filter(r => r.ttft_ms !== null).length >= 4"
                " && window.__lastSnapshot.slo.windows[0].answered >= 4"
                " && window.__lastSnapshot.forms.generated >= 3",
                timeout=150_000,
                polling=500,
            )
            assert load.poll() is None, "the load generator stopped early"
            assert page.locator("#status").inner_text().strip().lower() == "live"
            assert _count(page, "#waterfall .request-row") >= 4
            assert _count(page, "#waterfall .bar-actual") > 0
            assert _count(page, "#waterfall .bar-planned") > 0
            for chart in ("#ttft-tier", "#ttft-prompt", "#ttft-cache", "#cache-share"):
                assert _count(page, f"{chart} .bar") > 0, chart
            assert _count(page, "#planner-chart circle, #planner-chart path") > 0
            assert page.locator("#slo-60").inner_text().strip() not in ("", "—", "-")
            assert int(page.locator("#count-answered").inner_text()) >= 4
            # The answer forms: the mix, the stops, and the two first-token distributions.
            assert _count(page, "#forms-mix .bar-form[data-form='quote']") == 1
            assert _count(page, "#forms-mix .bar-form[data-form='passages']") == 1
            assert _count(page, "#forms-legend li") == len(FORM_NAMES)
            assert int(page.locator("#forms-generated").inner_text()) >= 3
            assert page.locator("#forms-repetition").inner_text().strip().isdigit()
            for chart in ("#ttft-model", "#ttft-without-model"):
                assert _count(page, f"{chart} .bar") > 0, chart
            assert _count(page, "#waterfall .mark-form") >= 4

            row = page.locator("#waterfall .request-row").first
            trace_id = row.get_attribute("data-trace-id")
            row.click()
            assert page.locator("#detail-trace-id").inner_text().strip() == trace_id
            form = page.locator("#detail-form").inner_text()
            assert any(name in form for name in FORM_NAMES), form
            reason = page.locator("#detail-form-reason").inner_text().strip()
            assert reason not in ("", "\u2013"), "no form_reason"  # format.js's dash: none

            seen = int(page.evaluate("Number(document.body.dataset.snapshots)"))
            page.wait_for_function(
                f"Number(document.body.dataset.snapshots) > {seen}", timeout=10_000
            )
            ARTIFACT.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACT), full_page=True)
        finally:
            browser.close()
    assert problems == []
    assert ARTIFACT.stat().st_size > 10_000
