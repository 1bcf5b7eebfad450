"""How many of a prompt's tokens the engine will have to compute: a running estimate.

The prompt layout predicts the prefix an SGLang worker should still hold (the system prompt and
the passages continuing a sequence recently sent to it); the engine reports what it actually
served from its cache. The ratio between the two drifts with eviction and load, so each worker
keeps an exponentially weighted estimate of it, clipped to [0, 1] per observation so that one
odd request cannot swing it. The planner prices generation by the uncached tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class _Running:
    hit_ratio: float
    cached_share: float
    observations: int = 0
    cached_tokens: int = 0
    prompt_tokens: int = 0


@dataclass(frozen=True, slots=True)
class CacheStats:
    """A worker's totals: `share` is cached over prompt tokens since the start."""

    worker: str
    observations: int
    prompt_tokens: int
    cached_tokens: int
    share: float
    hit_ratio: float


@dataclass(slots=True)
class CacheEstimator:
    """Per worker: the share of the predicted cached prefix that really was cached."""

    alpha: float = 0.1
    prior_hit_ratio: float = 0.8
    # Before any prompt was seen, the share of a prompt's tokens expected from the cache.
    prior_cached_share: float = 0.0
    _workers: dict[str, _Running] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 0.0 < self.alpha <= 1.0:
            raise ValueError("alpha must be in (0, 1]")
        if not 0.0 <= self.prior_hit_ratio <= 1.0:
            raise ValueError("prior_hit_ratio must be in [0, 1]")

    def _running(self, worker: str) -> _Running:
        running = self._workers.get(worker)
        if running is None:
            running = self._workers[worker] = _Running(
                self.prior_hit_ratio, self.prior_cached_share
            )
        return running

    def observe(
        self, worker: str, prompt_tokens: int, expected_cached: int, cached_tokens: int
    ) -> None:
        """One finished prompt: what the layout predicted and what the engine reported."""
        running = self._running(worker)
        running.observations += 1
        running.prompt_tokens += max(prompt_tokens, 0)
        running.cached_tokens += max(cached_tokens, 0)
        if prompt_tokens > 0:
            share = min(max(cached_tokens / prompt_tokens, 0.0), 1.0)
            running.cached_share += self.alpha * (share - running.cached_share)
        if expected_cached > 0:
            ratio = min(max(cached_tokens / expected_cached, 0.0), 1.0)
            running.hit_ratio += self.alpha * (ratio - running.hit_ratio)

    def expected_uncached(self, worker: str, prompt_tokens: int, expected_cached: int) -> float:
        """Tokens the worker is expected to compute for a prompt of `prompt_tokens` whose
        layout predicts `expected_cached` of them cached."""
        hit_ratio = self._running(worker).hit_ratio
        cached = min(max(expected_cached, 0), prompt_tokens) * hit_ratio
        return float(prompt_tokens) - cached

    def cached_share(self, worker: str) -> float:
        """The recent share of `worker`'s prompt tokens served from its cache: what a prompt
        not yet laid out can expect (the planner's view before retrieval)."""
        return self._running(worker).cached_share

    def stats(self) -> list[CacheStats]:
        return [
            CacheStats(
                worker=worker,
                observations=r.observations,
                prompt_tokens=r.prompt_tokens,
                cached_tokens=r.cached_tokens,
                share=r.cached_tokens / r.prompt_tokens if r.prompt_tokens else 0.0,
                hit_ratio=r.hit_ratio,
            )
            for worker, r in sorted(self._workers.items())
        ]
