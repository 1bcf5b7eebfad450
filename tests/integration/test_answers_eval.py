"""`answer-eval answers` end to end on SQuAD questions: in-process and through a running
service on the real tiny SGLang, which must agree; the scores of answers known in advance
(a scripted generator); and a run interrupted by an answer that hangs (the fake)."""

from __future__ import annotations

import itertools
import json
import threading
import time
from pathlib import Path

import httpx
import pytest

from answer_service.runtime.components import Components
from answer_service.runtime.settings import Settings
from eval.commands.main import main
from generation.server.launch import SGLangServer
from tests.fakes.fake_sglang import FakeSGLangState, create_fake_sglang
from tests.integration.conftest import TINY_ANSWERS, ServiceFactory
from tests.support import SQUAD_QUESTIONS, open_text, serve_in_thread

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def questions(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first six questions (Super Bowl 50, inside the 150-passage test index)."""
    path = tmp_path_factory.mktemp("answers") / "questions.jsonl"
    with open_text(SQUAD_QUESTIONS) as source:
        path.write_text("".join(itertools.islice(source, 6)))
    return path


def _run(args: list[str], out: Path) -> dict[str, object]:
    assert main(["answers", *args, "--out", str(out)]) == 0
    result: dict[str, object] = json.loads(out.read_text())
    return result


def _in_process(questions: Path, squad_corpus: Path, squad_index: Path, sglang: str) -> list[str]:
    return [
        *("--questions", str(questions), "--ttft-budget-ms", "5000", "--top-k", "3"),
        *("--answer-mode", "passages"),
        *("--passages", str(squad_corpus), "--index", str(squad_index)),
        *("--sglang-url", sglang, "--reranker", "none"),
    ]


@pytest.mark.sglang
def test_in_process_and_over_http_agree(
    questions: Path,
    squad_index: Path,
    squad_corpus: Path,
    tiny_service: ServiceFactory,
    tiny_sglang: SGLangServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same questions through the pipeline in-process and through the service, both on the
    real tiny SGLang: the same prompts, the same greedy answers, the same scores. Its cache is
    flushed before each run, so both decode from a cold cache."""
    # In-process, the pipeline reads the service's settings from the environment.
    for name, value in TINY_ANSWERS.items():
        monkeypatch.setenv(f"ANSWER_{name.upper()}", str(value))
    monkeypatch.setenv("ANSWER_ANSWER_CACHE_TTL_S", "0")
    # The fixed configuration, as in the test below: sources are the prompt's passages.
    monkeypatch.setenv("ANSWER_PLANNER", "false")
    monkeypatch.setenv("ANSWER_ABSTAIN_BELOW", "0")
    common = ["--questions", str(questions), "--ttft-budget-ms", "5000", "--top-k", "3"]
    common += ["--answer-mode", "passages"]
    _flush(tiny_sglang)
    local = _run(
        _in_process(questions, squad_corpus, squad_index, tiny_sglang.url), tmp_path / "local.json"
    )
    with tiny_service(planner="off") as url:
        _flush(tiny_sglang)
        remote = _run([*common, "--url", url], tmp_path / "remote.json")

    assert local["dataset"] == {"questions": 6, "answerable": 6, "with_gold_passage": 6}
    metrics, remote_metrics = local["metrics"], remote["metrics"]
    assert isinstance(metrics, dict)
    assert isinstance(remote_metrics, dict)
    assert metrics["ok"] == remote_metrics["ok"] == 6
    # All six gold passages are Super_Bowl_50-0 or -1, which hybrid retrieval finds.
    assert metrics["gold_in_sources"] == remote_metrics["gold_in_sources"] == 1.0
    assert metrics["ttft_ms"]["p50"] is not None
    for name in ("exact_match", "f1", "answer_recall", "citation_precision", "citation_recall"):
        assert remote_metrics[name] == metrics[name], name
    requests = [local["requests"], remote["requests"]]
    assert isinstance(requests[0], list)
    assert isinstance(requests[1], list)
    for mine, theirs in zip(*requests, strict=True):
        assert mine["source_doc_ids"] == theirs["source_doc_ids"]
        assert mine["answer"] == theirs["answer"]


def _flush(server: SGLangServer) -> None:
    httpx.post(f"{server.url}/flush_cache", timeout=30).raise_for_status()


def test_known_answers_get_known_scores(
    questions: Path,
    squad_index: Path,
    squad_corpus: Path,
    chatml_tokenizer_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The scores of answers whose words are known in advance, which no real model writes on
    demand: every question gets the first one's answer (Denver Broncos), citing source 1."""
    # The fixed configuration: every answer's prompt (and so its sources) holds the top 3; the
    # planner would give back-to-back questions fewer.
    monkeypatch.setenv("ANSWER_PLANNER", "false")
    monkeypatch.setenv("ANSWER_ABSTAIN_BELOW", "0")
    state = FakeSGLangState(
        model_path=str(chatml_tokenizer_dir), tokens=("Denver", " Broncos", " [1]", ".")
    )
    with serve_in_thread(create_fake_sglang(state)) as sglang:
        local = _run(
            _in_process(questions, squad_corpus, squad_index, sglang), tmp_path / "local.json"
        )

    metrics = local["metrics"]
    assert isinstance(metrics, dict)
    answers = [json.loads(line)["answers"] for line in questions.read_text().splitlines()]
    expected_recall = sum(any("Denver Broncos" in a for a in golds) for golds in answers) / 6
    assert metrics["answer_recall"] == pytest.approx(round(expected_recall, 4))
    # "Denver Broncos [1]." is an exact match once the citation marker is set aside.
    exact = sum("Denver Broncos" in golds for golds in answers) / 6
    assert metrics["exact_match"] == pytest.approx(round(exact, 4))
    assert exact > 0
    assert metrics["ok"] == 6
    assert metrics["gold_in_sources"] == 1.0
    # "[1]" cites the top source: right exactly when the top source is the gold passage.
    requests = local["requests"]
    assert isinstance(requests, list)
    golds = [json.loads(line)["gold_passage_id"] for line in questions.read_text().splitlines()]
    top_is_gold = [r["source_doc_ids"][0] == g for r, g in zip(requests, golds, strict=True)]
    assert metrics["citation_recall"] == pytest.approx(round(sum(top_is_gold) / 6, 4))
    assert metrics["cited_share"] == 1.0
    assert metrics["abstention_rate"] is None  # no unanswerable questions here


def test_an_interrupted_run_resumes_without_asking_again(
    questions: Path, service: ServiceFactory, chatml_tokenizer_dir: Path, tmp_path: Path
) -> None:
    state = FakeSGLangState(model_path=str(chatml_tokenizer_dir))
    out = tmp_path / "run.json"
    args = ["answers", "--questions", str(questions), "--ttft-budget-ms", "5000", "--out", str(out)]

    def stall_after_three() -> None:
        while len(state.requests) < 4:
            time.sleep(0.002)
        state.mode = "slow"

    with serve_in_thread(create_fake_sglang(state)) as sglang, service(sglang_url=sglang) as url:
        # The fourth answer hangs after its first token, past the client's timeout: the run stops with an error.
        state.tokens = ("x",) * 30
        threading.Thread(target=stall_after_three, daemon=True).start()
        assert main([*args, "--url", url, "--request-timeout-s", "2"]) == 2
        checkpoint = out.with_name("run.json.partial.jsonl")
        assert len(checkpoint.read_text().splitlines()) >= 1 + 3
        answered = len(checkpoint.read_text().splitlines()) - 1
        assert not out.exists()

        state.mode = "ok"
        state.requests.clear()
        assert main([*args, "--url", url]) == 0
    assert len(state.requests) == 6 - answered
    assert json.loads(out.read_text())["metrics"]["ok"] == 6
    assert not checkpoint.exists()


async def test_in_process_answering_starts_once_the_configured_reranker_has_loaded(
    squad_index: Path, chatml_tokenizer_dir: Path
) -> None:
    """A run measures the service as configured: the reranker loads after warm-up, and the
    first questions would otherwise go without it (a short run, all of it)."""
    state = FakeSGLangState(model_path=str(chatml_tokenizer_dir))
    with serve_in_thread(create_fake_sglang(state)) as sglang:
        settings = Settings(
            index_dir=squad_index, sglang_url=sglang, reranker_model="builtin", planner="priors"
        )
        components = Components.create(settings)
        try:
            components.start_warm_up()
            await components.wait_ready(reranker=True)
            assert components.reranker_status == "builtin"
            assert components.retriever is not None
            assert components.retriever.reranker is not None
        finally:
            await components.aclose()
