"""Stand-in for ``sgl_kernel`` on a CPU box without AMX (SGLang server process only).

SGLang's CPU kernels come from an unpublished source build of sgl-kernel. Without AMX every
layer takes its ``forward_native`` path; the one helper still called unconditionally is
``assign_req_to_token_pool_cpu``, implemented here in plain torch.

SGLang also imports other ``*_cpu`` kernels at module level behind ``if _is_cpu:`` guards
(speculative decoding, KV-cache moves) that plain text serving never calls: those names
resolve to stubs that raise ``NotImplementedError`` when called. Any other attribute raises
``AttributeError`` at once, so a code path that needs a real kernel fails loudly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

import torch


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """For request i, write the next ``end_offset[i] - start_offset[i]`` entries of
    ``out_cache_loc`` (consumed in order across requests) into row ``req_pool_indices[i]``
    of ``req_to_token``, columns ``start_offset[i]:end_offset[i]``."""
    del pool_len  # row width of req_to_token; torch checks bounds itself
    rows = req_pool_indices.tolist()
    starts = start_offset.tolist()
    ends = end_offset.tolist()
    consumed = 0
    for row, start, end in zip(rows, starts, ends, strict=True):
        length = int(end) - int(start)
        if length <= 0:
            continue
        piece = out_cache_loc[consumed : consumed + length]
        req_to_token[int(row), int(start) : int(end)] = piece.to(req_to_token.dtype)
        consumed += length


def _unavailable_kernel(name: str) -> Callable[..., NoReturn]:
    def kernel(*args: Any, **kwargs: Any) -> NoReturn:
        raise NotImplementedError(
            f"sgl_kernel.{name} was called, but the CPU stand-in from generation/sglang_compat "
            "has no such kernel (only assign_req_to_token_pool_cpu is implemented)"
        )

    kernel.__name__ = kernel.__qualname__ = name
    return kernel


def __getattr__(name: str) -> Any:
    if name.endswith("_cpu"):
        return _unavailable_kernel(name)
    raise AttributeError(
        f"sgl_kernel.{name} is not available: this is the CPU stand-in from "
        "generation/sglang_compat, which provides only assign_req_to_token_pool_cpu"
    )
