"""Each model's device and GPU share, and SGLang's share of a GPU it shares with them: pure
functions of the settings and a GPU count."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from answer_service.runtime.placement import (
    SGLANG_RESERVE_FRACTION,
    DeviceSlot,
    PlacementError,
    SGLangWorkerSlot,
    apply_torch_memory_caps,
    plan_placement,
    plan_sglang_workers,
)
from answer_service.runtime.settings import Settings


def test_no_gpu_puts_everything_on_the_cpu() -> None:
    placement = plan_placement(Settings(), gpu_count=0)

    assert placement.embedder == placement.reranker == placement.index == DeviceSlot("cpu")
    assert placement.torch_memory_caps() == {}
    assert plan_sglang_workers(Settings(), placement, workers=2, gpu_count=0) == ()


def test_by_default_one_gpu_is_shared_and_sglang_leaves_room() -> None:
    settings = Settings()
    placement = plan_placement(settings, gpu_count=1)

    assert placement.embedder == DeviceSlot("cuda:0", 0.05)
    assert placement.describe() == "embedder=cuda:0@0.05 reranker=cuda:0@0.05 index=cuda:0@0.05"
    assert placement.torch_memory_caps() == {0: 0.15}
    (worker,) = plan_sglang_workers(settings, placement, workers=1, gpu_count=1)
    assert worker == SGLangWorkerSlot(0, 0.72)
    assert worker.mem_fraction_static is not None
    assert worker.mem_fraction_static + 0.15 + SGLANG_RESERVE_FRACTION <= 1.0


def test_each_model_gets_its_own_device_and_share() -> None:
    settings = Settings(device="cpu", placement="embedder=cuda:1@0.02, reranker=cuda:1@0.08")
    placement = plan_placement(settings, gpu_count=2)

    assert placement.embedder == DeviceSlot("cuda:1", 0.02)
    assert placement.reranker == DeviceSlot("cuda:1", 0.08)
    assert placement.index == DeviceSlot("cpu")
    assert placement.torch_memory_caps() == {1: 0.1}
    workers = plan_sglang_workers(settings, placement, workers=2, gpu_count=2)
    assert workers == (SGLangWorkerSlot(0, None), SGLangWorkerSlot(1, 0.77))


def test_a_gpu_that_is_not_there_falls_back_to_the_cpu_and_says_so() -> None:
    placement = plan_placement(Settings(device="cuda:3"), gpu_count=1)
    assert placement.index.device == "cpu"
    assert placement.index.note == "index asked for cuda:3, 1 GPU(s) seen"
    assert "index=cpu(index asked for cuda:3, 1 GPU(s) seen)" in placement.describe()


def test_sglang_share_can_be_set_and_is_checked() -> None:
    settings = Settings(placement="sglang=auto@0.6")
    placement = plan_placement(settings, gpu_count=1)
    assert plan_sglang_workers(settings, placement, 1, 1) == (SGLangWorkerSlot(0, 0.6),)
    alone = Settings(device="cpu", placement="sglang=cuda@0.6")
    assert plan_sglang_workers(alone, plan_placement(alone, 1), 1, 1) == (SGLangWorkerSlot(0, 0.6),)

    greedy = Settings(placement="sglang=auto@0.9")
    with pytest.raises(PlacementError, match="add up to 1 or more"):
        plan_sglang_workers(greedy, plan_placement(greedy, 1), 1, 1)
    crowded = Settings(placement="embedder=auto@0.5,reranker=auto@0.2")
    with pytest.raises(PlacementError, match="leaving SGLang"):
        plan_sglang_workers(crowded, plan_placement(crowded, 1), 1, 1)


def test_sglang_workers_need_a_gpu_each() -> None:
    settings = Settings(device="cpu", placement="sglang=cuda:1")
    placement = plan_placement(settings, gpu_count=2)
    assert plan_sglang_workers(settings, placement, 1, 2) == (SGLangWorkerSlot(1, None),)
    with pytest.raises(PlacementError, match="need GPUs 1-2; 2 seen"):
        plan_sglang_workers(settings, placement, 2, 2)
    on_cpu = Settings(placement="sglang=cpu")
    assert plan_sglang_workers(on_cpu, plan_placement(on_cpu, 2), 2, 2) == ()


def test_torch_caps_are_set_per_gpu() -> None:
    calls: list[tuple[float, int]] = []
    settings = Settings(placement="index=cuda:1")
    caps = apply_torch_memory_caps(
        plan_placement(settings, 2), lambda fraction, gpu: calls.append((fraction, gpu))
    )
    assert caps == {0: 0.1, 1: 0.05}
    assert calls == [(0.1, 0), (0.05, 1)]
    assert apply_torch_memory_caps(plan_placement(Settings(), 0)) == {}


@pytest.mark.parametrize("bad", ["gpu", "cuda:", "cuda:x", "CUDA"])
def test_device_names_are_validated(bad: str) -> None:
    with pytest.raises(ValidationError):
        Settings(device=bad)
    with pytest.raises(ValidationError, match="is not auto, cpu, cuda or cuda:N"):
        Settings(placement=f"embedder={bad}")


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        ("embedder=cuda:0@1.0", "between 0 and 1"),
        ("gpu=cuda:0", "PART=DEVICE"),
        ("embedder", "PART=DEVICE"),
        ("index=cpu,index=cuda", "twice"),
    ],
)
def test_a_placement_that_cannot_be_placed_is_refused(bad: str, reason: str) -> None:
    with pytest.raises(ValidationError, match=reason):
        Settings(placement=bad)


def test_the_placement_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANSWER_PLACEMENT", "reranker=cpu, sglang=cuda:2@0.5")
    settings = Settings()
    assert settings.placed("reranker").device == "cpu"
    assert settings.placed("embedder") == settings.placed("index")
    sglang = settings.placed("sglang")
    assert (sglang.device, sglang.gpu_share) == ("cuda:2", 0.5)
