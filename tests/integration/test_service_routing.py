"""The service routing over several SGLang workers itself (ANSWER_SGLANG_WORKERS) when workers
go down, which fakes do on demand. Which worker answers what is tested on two real workers in
test_sglang_router.py."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.fakes.fake_sglang import FakeSGLangState, create_fake_sglang
from tests.integration.conftest import ServiceFactory
from tests.support import serve_in_thread

pytestmark = pytest.mark.integration


def test_a_worker_down_is_named_and_none_left_means_not_ready(
    service: ServiceFactory, chatml_tokenizer_dir: Path
) -> None:
    states = [FakeSGLangState(model_path=str(chatml_tokenizer_dir)) for _ in range(2)]
    with (
        serve_in_thread(create_fake_sglang(states[0])) as w0,
        serve_in_thread(create_fake_sglang(states[1])) as w1,
        service(sglang_workers=[w0, w1]) as url,
    ):
        # One worker down: readiness says which, and stays ready (the other answers).
        states[1].healthy = False
        ready = httpx.get(f"{url}/readyz", timeout=10)
        assert ready.status_code == 200
        assert ready.json()["workers_down"] == [w1]
        states[0].healthy = False  # none left: not ready
        ready = httpx.get(f"{url}/readyz", timeout=10)
        assert ready.status_code == 503
        assert any(w1 in reason for reason in ready.json()["reasons"])
