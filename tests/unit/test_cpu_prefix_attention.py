"""The CPU prefix-attention kernel for SGLang's torch_native backend, against plain math.

The compat folder must never be on the main project's path (its stand-ins would shadow real
packages), so its modules are loaded here from their files. SGLang itself is not needed.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from generation.server.launch import (
    COMPAT_DIR,
    CPU_PREFIX_ATTENTION_ENV,
    SGLangServer,
    SGLangServerConfig,
)

PACKAGE_DIR = COMPAT_DIR / "cpu_prefix_attention"


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


kernel = _load("cpu_prefix_attention_kernel_under_test", PACKAGE_DIR / "kernel.py")
hook = _load("cpu_prefix_attention_hook_under_test", PACKAGE_DIR / "hook.py")


def _reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    prefix_len: int,
    scale: float,
    window: int | None,
) -> torch.Tensor:
    """Row by row softmax attention in float64: q [n, H, D], k/v [L, Hkv, D] -> [n, H, Dv]."""
    group = q.shape[1] // k.shape[1]
    out = torch.empty(q.shape[0], q.shape[1], v.shape[2], dtype=torch.float64)
    for i in range(q.shape[0]):
        pos = prefix_len + i
        first = 0 if window is None else max(0, pos - window)
        for h in range(q.shape[1]):
            keys = k[first : pos + 1, h // group].double()
            scores = keys @ q[i, h].double() * scale
            out[i, h] = torch.softmax(scores, dim=0) @ v[first : pos + 1, h // group].double()
    return out


class Batch:
    """An extend batch laid out as SGLang's: a shuffled KV pool and a req_to_token table."""

    def __init__(
        self, requests: list[tuple[int, int]], heads: int, kv_heads: int, dtype: torch.dtype
    ) -> None:
        gen = torch.Generator().manual_seed(7)
        dim = 16
        total = sum(p + n for p, n in requests)
        self.k_cache = torch.randn(total + 5, kv_heads, dim, generator=gen).to(dtype)
        self.v_cache = torch.randn(total + 5, kv_heads, dim, generator=gen).to(dtype)
        slots = torch.randperm(total + 5, generator=gen)[:total]
        self.req_to_token = torch.zeros(len(requests) + 2, max(p + n for p, n in requests) + 3)
        self.req_to_token = self.req_to_token.to(torch.int64)
        self.rows = [2 + i for i in range(len(requests))][::-1]
        used = 0
        for row, (prefix_len, new_len) in zip(self.rows, requests, strict=True):
            self.req_to_token[row, : prefix_len + new_len] = slots[
                used : used + prefix_len + new_len
            ]
            used += prefix_len + new_len
        new_total = sum(n for _, n in requests)
        self.query = torch.randn(new_total, heads, dim, generator=gen).to(dtype)
        self.requests = requests

    def args(self) -> tuple[Any, ...]:
        prefix = torch.tensor([p for p, _ in self.requests])
        new = torch.tensor([n for _, n in self.requests])
        return (
            self.query,
            torch.empty_like(self.query),
            self.k_cache,
            self.v_cache,
            self.req_to_token,
            torch.tensor(self.rows),
            prefix + new,
            prefix,
            new,
        )

    def expected(self, scale: float, window: int | None) -> torch.Tensor:
        parts, start = [], 0
        for row, (prefix_len, new_len) in zip(self.rows, self.requests, strict=True):
            slots = self.req_to_token[row, : prefix_len + new_len]
            q = self.query[start : start + new_len]
            parts.append(
                _reference(q, self.k_cache[slots], self.v_cache[slots], prefix_len, scale, window)
            )
            start += new_len
        return torch.cat(parts)


@pytest.mark.parametrize(
    ("requests", "window"),
    [
        ([(0, 9)], None),  # cold prefill: plain causal
        ([(40, 1)], None),  # one new token after a long cached prefix
        ([(33, 6), (0, 5), (12, 12), (7, 0)], None),  # mixed batch, one with nothing new
        ([(20, 8), (0, 10)], 5),  # sliding window
    ],
)
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (6, 2)])
def test_new_rows_match_reference_attention(
    requests: list[tuple[int, int]], window: int | None, heads: int, kv_heads: int
) -> None:
    batch = Batch(requests, heads, kv_heads, torch.float32)
    scale = 1.0 / math.sqrt(16)

    out = kernel.extend_attention(
        *batch.args(), scaling=scale, enable_gqa=heads != kv_heads, sliding_window_size=window
    )

    torch.testing.assert_close(out.double(), batch.expected(scale, window), atol=1e-5, rtol=1e-5)


def test_bfloat16_cache_matches_reference_within_bf16_error() -> None:
    batch = Batch([(50, 7), (0, 6)], 6, 2, torch.bfloat16)

    out = kernel.extend_attention(*batch.args(), scaling=0.3, enable_gqa=True)

    torch.testing.assert_close(out.double(), batch.expected(0.3, None), atol=3e-2, rtol=3e-2)


def test_mask_is_bottom_right_aligned() -> None:
    mask = kernel.bottom_right_mask(3, 2, None, torch.device("cpu"))

    assert mask is not None
    assert mask.tolist() == [[True, True, True, True, False], [True] * 5]
    assert kernel.bottom_right_mask(0, 4, None, torch.device("cpu")) is None


def test_inconsistent_lengths_fail_loudly() -> None:
    batch = Batch([(4, 3)], 2, 2, torch.float32)
    args = list(batch.args())
    args[6] = args[6] + 1  # seq_lens no longer prefix + new

    with pytest.raises(RuntimeError, match="not prefix \\+ new tokens"):
        kernel.extend_attention(*args, scaling=None, enable_gqa=False)


def test_unsupported_calls_go_to_the_original() -> None:
    calls: list[dict[str, Any]] = []

    def original(self: object, *args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append(kwargs)
        return torch.zeros(1)

    method = kernel.patched_extend_method(original)
    batch = Batch([(4, 3)], 2, 2, torch.float32)

    method(None, *batch.args(), None, scaling=None, causal=False)
    method(None, *batch.args(), torch.tensor([2]), scaling=None, causal=True)
    out = method(None, *batch.args(), None, scaling=0.25, causal=True)

    assert len(calls) == 2
    torch.testing.assert_close(out.double(), batch.expected(0.25, None), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("value", "on"), [(None, True), ("1", True), ("0", False), ("off", False), ("False", False)]
)
def test_switch(value: str | None, on: bool) -> None:
    environ = {} if value is None else {hook.SWITCH_ENV: value}
    assert hook.enabled(environ) is on


def test_other_sglang_version_leaves_backend_untouched(monkeypatch: pytest.MonkeyPatch) -> None:
    class Backend:
        def _run_sdpa_forward_extend(self) -> None: ...

    original = Backend._run_sdpa_forward_extend
    module = ModuleType(hook.TARGET_MODULE)
    module.TorchNativeAttnBackend = Backend  # type: ignore[attr-defined]
    monkeypatch.setattr(hook, "_sglang_version", lambda: "0.5.24")
    monkeypatch.delenv(hook.SWITCH_ENV, raising=False)

    assert hook.patch(module) is False
    assert Backend._run_sdpa_forward_extend is original


def test_server_config_switches_the_patch_off_in_the_server_environment() -> None:
    off = SGLangServer(SGLangServerConfig(cpu_prefix_attention=False))
    on = SGLangServer(SGLangServerConfig())

    assert off.environment({}, "cpu")[CPU_PREFIX_ATTENTION_ENV] == "0"
    assert CPU_PREFIX_ATTENTION_ENV not in on.environment({}, "cpu")
    assert on.environment({CPU_PREFIX_ATTENTION_ENV: "0"}, "cpu")[CPU_PREFIX_ATTENTION_ENV] == "0"
    assert CPU_PREFIX_ATTENTION_ENV == hook.SWITCH_ENV
    assert (COMPAT_DIR / "sitecustomize.py").is_file()
