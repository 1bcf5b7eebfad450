"""schemathesis against the running service's own OpenAPI document (real index, embedder and
Redis; the real tiny SGLang): no generated request may get a 5xx. `FUZZ_MAX_EXAMPLES` sets the
examples per operation (the suite runs a few hundred cases; the run docs/operations.md quotes
uses 600, over 2,000 cases)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import ServiceFactory

pytestmark = [pytest.mark.integration, pytest.mark.sglang]

MAX_EXAMPLES = int(os.environ.get("FUZZ_MAX_EXAMPLES", "40"))
SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")


@pytest.fixture
def url(tiny_service: ServiceFactory) -> Iterator[str]:
    with tiny_service(
        redis_url="redis://127.0.0.1:6379/0",
        redis_prefix=f"fuzz-{uuid.uuid4().hex[:8]}:",
        answer_cache_ttl_s=60,
    ) as base:
        yield base


def test_no_generated_request_gets_a_server_error(url: str) -> None:
    done = subprocess.run(
        [
            str(SCHEMATHESIS),
            "run",
            f"{url}/openapi.json",
            "--checks",
            "not_a_server_error",
            "--max-examples",
            str(MAX_EXAMPLES),
            "--workers",
            "1",
            "--seed",
            "1",
            "--no-color",
        ],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    cases = re.search(r"(\d+) generated, (\d+) passed", output)
    assert cases is not None, output[-2000:]
    print(f"schemathesis: {cases.group(0)}")
    assert int(cases.group(1)) == int(cases.group(2)) > 100
