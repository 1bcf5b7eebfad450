"""`answer-service gpu-check` runs end to end here, without CUDA: both sides on the CPU (the real
MiniLM embedder twice, faiss against torch's exact search), written as the JSON the docs record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from answer_service.cli.main import main

pytestmark = pytest.mark.integration


def test_gpu_check_on_the_cpu_agrees_and_says_where_it_ran(tmp_path: Path) -> None:
    out = tmp_path / "gpu-check.json"
    sizes = ["--texts", "24", "--queries", "6", "--vectors", "3000"]
    code = main(["gpu-check", "--device", "cpu", *sizes, "--out", str(out)])

    report = json.loads(out.read_text())
    assert code == 0
    assert report["ok"] is True
    assert report["device"] == "cpu"
    assert "both sides ran on the CPU" in report["note"]
    assert report["embedder"]["cpu"]["device"] == report["embedder"]["other"]["device"] == "cpu"
    assert report["embedder"]["min_cosine"] >= 0.99
    search = report["search"]
    assert (search["cpu"]["backend"], search["other"]["backend"]) == ("faiss-cpu", "torch")
    assert search["same_top_k"] == 1.0
    assert search["vectors"] == 3000
    for side in ("cpu", "other"):
        assert search[side]["one_query_ms"] > 0
        assert report["embedder"][side]["one_query_ms"] > 0
