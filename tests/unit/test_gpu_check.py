"""`answer-service gpu-check`'s comparison of two top-k lists, and its arguments."""

from __future__ import annotations

import numpy as np
import pytest

from answer_service.cli.gpu_check import compared_device, same_top_k
from answer_service.cli.main import build_parser


def _lists(*pairs: tuple[list[int], list[float]]) -> tuple[np.ndarray, np.ndarray]:
    rows = np.array([r for r, _ in pairs], dtype=np.int64)
    scores = np.array([s for _, s in pairs], dtype=np.float32)
    return scores, rows


def test_same_rows_in_another_order_agree() -> None:
    a = _lists(([1, 2, 3], [0.9, 0.8, 0.7]))
    b = _lists(([2, 1, 3], [0.8, 0.9, 0.7]))
    assert same_top_k(a, b) == [True]


def test_a_row_swapped_at_a_tie_with_the_last_agrees_and_a_real_miss_does_not() -> None:
    cpu = _lists(([1, 2, 3], [0.9, 0.8, 0.7]), ([1, 2, 3], [0.9, 0.8, 0.7]))
    other = _lists(([1, 2, 4], [0.9, 0.8, 0.70001]), ([1, 2, 5], [0.9, 0.8, 0.75]))
    assert same_top_k(cpu, other) == [True, False]


def test_arguments() -> None:
    args = build_parser().parse_args(["gpu-check", "--device", "cuda:1", "--vectors", "5000"])
    assert (args.device, args.vectors, args.k, args.run.__name__) == (
        "cuda:1",
        5000,
        10,
        "_gpu_check",
    )
    with pytest.raises(SystemExit):
        build_parser().parse_args(["gpu-check", "--device", "gpu"])


def test_the_compared_device_falls_back_to_the_cpu_and_says_so() -> None:
    assert compared_device("auto", 2) == ("cuda:0", "")
    assert compared_device("cuda", 1) == ("cuda:0", "")
    assert compared_device("cuda:1", 2) == ("cuda:1", "")
    device, note = compared_device("auto", 0)
    assert (device, "no CUDA here" in note) == ("cpu", True)
    assert compared_device("cuda:2", 2) == (
        "cpu",
        "cuda:2 asked for, torch sees 2 GPU(s): both sides ran on the CPU",
    )
    assert compared_device("cpu", 2) == (
        "cpu",
        "--device cpu: both sides ran on the CPU (faiss against torch's exact search)",
    )
