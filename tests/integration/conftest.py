"""Real components, started once per session: the MiniLM index of SQuAD passages and SGLang."""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import pytest

from answer_service.http.api import create_app
from answer_service.runtime.configs import Experiment
from answer_service.runtime.settings import Settings
from generation.server.launch import (
    SGLangServer,
    SGLangServerConfig,
    ensure_smollm2_model,
    write_tiny_model,
)
from retrieval.embedder import EmbedderConfig, SentenceTransformerEmbedder
from retrieval.index.builder import build_index
from tests.support import SQUAD_PASSAGES, free_port, open_text, serve_in_thread, wait_ready

# The first SQuAD dev passages (Super Bowl 50, Warsaw, Normans, two of Nikola Tesla): all of
# tests/fixtures/squad/passages.jsonl.gz.
SQUAD_SUBSET = 150


@pytest.fixture(scope="session")
def squad_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("squad") / "passages.jsonl"
    with open_text(SQUAD_PASSAGES) as source, path.open("w") as target:
        target.writelines(itertools.islice(source, SQUAD_SUBSET))
    return path


@pytest.fixture(scope="session")
def squad_index(squad_corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("index") / "squad"
    build_index(squad_corpus, out, SentenceTransformerEmbedder(EmbedderConfig()), progress=False)
    return out


def _start(tmp: pytest.TempPathFactory, name: str, **config: Any) -> SGLangServer:
    server = SGLangServer(
        SGLangServerConfig(
            port=free_port(),
            startup_timeout_s=300.0,
            device="cpu",
            log_path=tmp.mktemp(f"{name}-log") / "sglang.log",
            **config,
        )
    )
    server.start()
    return server


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    return ensure_smollm2_model(SGLangServerConfig().cache_dir)


@pytest.fixture(scope="session")
def tiny_sglang(
    tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path
) -> Iterator[SGLangServer]:
    """SGLang with a tiny random-weights Llama and SmolLM2's tokenizer: protocol and cache."""
    model_dir = write_tiny_model(tmp_path_factory.mktemp("tiny-llama"), smollm2_dir)
    # One log line per decode step lets tests see when SGLang stops working on a request.
    server = _start(
        tmp_path_factory,
        "tiny",
        model_dir=model_dir,
        load_format="dummy",
        max_total_tokens=8192,
        extra_args=("--decode-log-interval", "1"),
    )
    yield server
    server.stop()


def requests_taken(server: SGLangServer) -> int:
    """Requests the server's scheduler has taken in so far: the `#new-seq` of every prefill
    batch its log reports (SGLang logs each one). What reached SGLang, seen from its side."""
    log = server.log_path.read_text(errors="replace")
    return sum(int(n) for n in re.findall(r"Prefill batch, #new-seq: (\d+)", log))


@pytest.fixture(scope="module")
def smollm2_sglang(
    tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path
) -> Iterator[SGLangServer]:
    server = _start(tmp_path_factory, "smollm2", model_dir=smollm2_dir, max_total_tokens=16384)
    yield server
    server.stop()


ServiceFactory = Callable[..., AbstractContextManager[str]]
EXPERIMENT_KNOBS = frozenset(field.name for field in dataclasses.fields(Experiment))

# Settings every service in these tests starts with; a test's own keyword wins.
SERVICE_DEFAULTS: dict[str, Any] = {
    "reranker_model": None,
    # Tests ask the same question again to see SGLang's cache, the planner or a fault: the
    # answer cache would answer instead. tests/integration/test_caches.py turns it on.
    "answer_cache_ttl_s": 0,
    # These tests are about generation's mechanics: the model answers from passages, and no
    # weak-evidence abstention stands in for it. The answer forms have their own tests
    # (test_answer_modes.py) with the service's defaults.
    "mode": "passages",
    "abstain_below": 0.0,
    # The planner starts from the priors shipped in code, which what these tests assert on the
    # planner was worked out against (and a fake SGLang has no timing worth calibrating to);
    # test_stage_calibration_service.py runs the warm-up calibration the service does by default.
    "planner": "priors",
}
# What `tiny_service` adds: random weights seldom stop, so a few tokens bound every answer.
TINY_ANSWERS: dict[str, Any] = {"max_new_tokens": 8}


@pytest.fixture(scope="session")
def service(squad_index: Path) -> ServiceFactory:
    """`with service(sglang_url=..., **settings) as url:` runs the app over real HTTP; a
    keyword naming a knob of `Experiment` (what the service fixes) goes to it instead."""

    @contextmanager
    def run(*, ready: bool = True, **overrides: Any) -> Iterator[str]:
        knobs = {k: overrides.pop(k) for k in list(overrides) if k in EXPERIMENT_KNOBS}
        settings = Settings(**{"index_dir": squad_index, **SERVICE_DEFAULTS, **overrides})
        with serve_in_thread(create_app(settings, Experiment(**knobs))) as url:
            if ready:
                wait_ready(url)
            yield url

    return run


@pytest.fixture(scope="session")
def tiny_service(service: ServiceFactory, tiny_sglang: SGLangServer) -> ServiceFactory:
    """`with tiny_service(**settings) as url:` the app answering through the real tiny SGLang:
    a normal answer's mechanics (events, spans, timing, caches, access), never its words."""

    def run(**overrides: Any) -> AbstractContextManager[str]:
        return service(**{"sglang_url": tiny_sglang.url, **TINY_ANSWERS, **overrides})

    return run
