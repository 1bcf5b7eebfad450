"""Extend attention over the new query rows only, against the whole sequence's cached keys.

Layout, as SGLang 0.5.23's extend batch hands it to ``_run_sdpa_forward_extend``: the new
tokens of all requests are concatenated in ``query``/``output`` ([new_tokens, heads, dim]);
request i contributes ``extend_seq_lens[i]`` of them, after ``extend_prefix_lens[i]`` tokens it
already has in the cache; ``seq_lens[i]`` is their sum. ``forward_extend`` writes the new keys
and values to the cache before calling us, so row ``req_pool_indices[i]`` of ``req_to_token``,
columns ``0:seq_lens[i]``, holds the cache slots of the whole sequence.

New query row j of a request sits at absolute position ``prefix + j`` and may attend keys
``0..prefix + j`` (bottom-right-aligned causal), minus keys older than the sliding window when
there is one: exactly the rows SGLang keeps from its padded full-sequence attention.

Only torch; no SGLang import, so it can be tested without SGLang.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import torch
from torch.nn.functional import scaled_dot_product_attention

logger = logging.getLogger("sglang_compat.cpu_prefix_attention")

# SGLang's method, unbound: (self, query, output, k_cache, v_cache, ...) -> output
ExtendMethod = Callable[..., torch.Tensor]


def bottom_right_mask(
    prefix_len: int,
    new_len: int,
    sliding_window_size: int | None,
    device: torch.device,
) -> torch.Tensor | None:
    """The [new_len, prefix_len + new_len] boolean mask (True = may attend), or None when plain
    top-left ``is_causal`` is already right (no prefix and no window)."""
    windowed = sliding_window_size is not None and sliding_window_size > -1
    if prefix_len == 0 and not windowed:
        return None
    q_pos = torch.arange(prefix_len, prefix_len + new_len, device=device).unsqueeze(1)
    k_pos = torch.arange(prefix_len + new_len, device=device).unsqueeze(0)
    mask = k_pos <= q_pos
    if windowed:
        assert sliding_window_size is not None
        mask &= k_pos >= q_pos - sliding_window_size
    return mask


def extend_attention(
    query: torch.Tensor,
    output: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    extend_prefix_lens: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    *,
    scaling: float | None,
    enable_gqa: bool,
    sliding_window_size: int | None = None,
) -> torch.Tensor:
    """Causal self-attention of each request's new tokens over its whole sequence; fills and
    returns ``output`` ([new_tokens, heads, v_dim])."""
    if query.dim() != 3:
        raise ValueError(f"query must be [tokens, heads, dim], got shape {tuple(query.shape)}")
    heads_first = query.movedim(0, 1)  # [heads, new_tokens, dim]
    requests = zip(
        req_pool_indices.tolist(),
        seq_lens.tolist(),
        extend_prefix_lens.tolist(),
        extend_seq_lens.tolist(),
        strict=True,
    )
    start = 0
    for row, seq_len, prefix_len, new_len in requests:
        if prefix_len + new_len != seq_len:
            raise RuntimeError(
                f"extend batch is not prefix + new tokens: seq_len={seq_len} "
                f"prefix_len={prefix_len} extend_len={new_len}"
            )
        end = start + new_len
        if new_len == 0:
            continue
        slots = req_to_token[row, :seq_len]
        key = k_cache[slots].movedim(0, 1)  # [kv_heads, seq_len, dim]
        value = v_cache[slots].movedim(0, 1)
        rows = heads_first[:, start:end, :]
        if not (rows.dtype == key.dtype == value.dtype):
            key, value = key.to(rows.dtype), value.to(rows.dtype)
        mask = bottom_right_mask(prefix_len, new_len, sliding_window_size, rows.device)
        attended = scaled_dot_product_attention(
            rows.unsqueeze(0),
            key.unsqueeze(0),
            value.unsqueeze(0),
            attn_mask=mask,
            is_causal=mask is None,
            scale=scaling,
            enable_gqa=enable_gqa,
        )
        output[start:end] = attended.squeeze(0).movedim(0, 1)
        start = end
    if start != query.shape[0]:
        raise RuntimeError(f"extend_seq_lens cover {start} tokens, query has {query.shape[0]}")
    return output


def _unsupported(
    query: torch.Tensor, encoder_lens: torch.Tensor | None, causal: bool, is_cross_attn: bool
) -> str | None:
    """Why a call must go to SGLang's own method, or None when ours computes the same rows."""
    if encoder_lens is not None or is_cross_attn:
        return "encoder-decoder attention"
    if not causal:
        return "non-causal attention"
    if query.device.type != "cpu":
        return f"device {query.device.type}"
    return None


def patched_extend_method(original: ExtendMethod) -> ExtendMethod:
    """A drop-in for ``TorchNativeAttnBackend._run_sdpa_forward_extend`` (same signature) that
    runs `extend_attention` and hands anything else back to ``original``."""
    reported: set[str] = set()

    @functools.wraps(original)
    def run_sdpa_forward_extend(
        self: Any,
        query: torch.Tensor,
        output: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        req_to_token: torch.Tensor,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        extend_prefix_lens: torch.Tensor,
        extend_seq_lens: torch.Tensor,
        encoder_lens: torch.Tensor | None = None,
        scaling: float | None = None,
        enable_gqa: bool = False,
        causal: bool = False,
        is_cross_attn: bool = False,
        sliding_window_size: int | None = None,
    ) -> torch.Tensor:
        reason = _unsupported(query, encoder_lens, causal, is_cross_attn)
        if reason is not None:
            if reason not in reported:
                reported.add(reason)
                logger.info("cpu prefix attention falls back to sglang's reason=%s", reason)
            return original(
                self,
                query,
                output,
                k_cache,
                v_cache,
                req_to_token,
                req_pool_indices,
                seq_lens,
                extend_prefix_lens,
                extend_seq_lens,
                encoder_lens,
                scaling=scaling,
                enable_gqa=enable_gqa,
                causal=causal,
                is_cross_attn=is_cross_attn,
                sliding_window_size=sliding_window_size,
            )
        return extend_attention(
            query,
            output,
            k_cache,
            v_cache,
            req_to_token,
            req_pool_indices,
            seq_lens,
            extend_prefix_lens,
            extend_seq_lens,
            scaling=scaling,
            enable_gqa=enable_gqa,
            sliding_window_size=sliding_window_size,
        )

    return run_sdpa_forward_extend
