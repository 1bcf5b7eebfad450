"""The dashboard's snapshot: rolling figures computed from request summaries (pure).

- SLO attainment: over admitted requests (refusals are counted apart), the share whose first
  token came within its budget; an answer that failed, was cut to its sources or was abandoned
  by its client did not meet it.
- TTFT percentiles (nearest rank) by tenant tier, prompt-length bucket and cache status: a
  prompt is a cache `hit` when SGLang served at least half of its tokens from its prefix cache.
- The prefix cache's share of prompt tokens per SGLang worker.
- The answer forms (form_labels.py) over the last 15 minutes: answers per form and per
  `answer_mode` asked, how they ended, the repetition stops, and the unsupported-sentence rate:
  sentences no source supports per model-served answer (`unsupported_rate`), and the share of
  model-served answers with at least one (`unsupported_answer_share`). TTFT is also split into
  model-served answers (focused, passages, not from the cache: the model's seconds) and the
  rest (quotes, abstentions, cached answers: the service's milliseconds), and by form.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict
from typing import Any

from answer_service.runtime.observability.form_labels import (
    SERVED_FORMS,
    UNKNOWN_FORM,
    model_served,
    served_form,
)
from answer_service.runtime.observability.request_log import RequestSummary

WINDOWS_S = (60, 300, 900)
SERIES_BUCKET_S = 10
RECENT_REQUESTS = 100
PLANNER_POINTS = 300
PROMPT_BUCKETS = ((512, "<512"), (1024, "512-1k"), (2048, "1k-2k"), (math.inf, ">=2k"))
CACHE_HIT_SHARE = 0.5
_ANSWERED = {"ok", "abstained", "error", "cancelled", "sources_only"}
MODES = ("auto", "quote", "focused", "passages")
SERVED = ("model", "without model")


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100) of unsorted values; None for none."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


def prompt_bucket(tokens: int) -> str:
    return next(name for bound, name in PROMPT_BUCKETS if tokens < bound)


def cache_status(summary: RequestSummary) -> str:
    if summary.prompt_tokens <= 0:
        return "miss"
    return "hit" if summary.cached_tokens / summary.prompt_tokens >= CACHE_HIT_SHARE else "miss"


def _form_of(summary: RequestSummary) -> str:
    return served_form(summary.form, from_cache=summary.from_cache)


def _served(summary: RequestSummary) -> str:
    """Who served the answer: the model, or the service without it; unknown for an older
    replica's summary (no form), which is kept out of both."""
    if not summary.form and not summary.from_cache:
        return UNKNOWN_FORM
    return "model" if model_served(summary.form, from_cache=summary.from_cache) else "without model"


def _ordered(counts: Counter[str], order: Sequence[str]) -> list[str]:
    """`order` whole (a count of 0 included), then any other key counted, sorted."""
    return [*order, *sorted(k for k in counts if k not in order)]


def _share(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def _ttft_groups(
    summaries: Iterable[RequestSummary], key: Callable[[RequestSummary], str], order: Sequence[str]
) -> list[dict[str, Any]]:
    groups: dict[str, list[float]] = defaultdict(list)
    for s in summaries:
        if s.ttft_ms is not None:
            groups[key(s)].append(s.ttft_ms)
    keys = [k for k in order if k in groups] + sorted(k for k in groups if k not in order)
    return [
        {
            "key": k,
            "count": len(groups[k]),
            "p50": percentile(groups[k], 50),
            "p95": percentile(groups[k], 95),
            "p99": percentile(groups[k], 99),
        }
        for k in keys
    ]


def _admitted(summary: RequestSummary) -> bool:
    return summary.outcome in _ANSWERED


def _met(summary: RequestSummary) -> bool:
    return summary.outcome in ("ok", "abstained") and summary.within_budget


def _slo(summaries: Sequence[RequestSummary], now: float) -> dict[str, Any]:
    windows = []
    for window_s in WINDOWS_S:
        admitted = [s for s in summaries if s.at >= now - window_s and _admitted(s)]
        met = sum(_met(s) for s in admitted)
        windows.append(
            {
                "window_s": window_s,
                "answered": len(admitted),
                "met": met,
                "attainment": round(met / len(admitted), 4) if admitted else None,
            }
        )
    start = math.floor((now - max(WINDOWS_S)) / SERIES_BUCKET_S) * SERIES_BUCKET_S
    buckets = [[0, 0] for _ in range(math.ceil((now - start) / SERIES_BUCKET_S))]
    for s in summaries:
        index = int((s.at - start) // SERIES_BUCKET_S)
        if _admitted(s) and 0 <= index < len(buckets):
            buckets[index][0] += 1
            buckets[index][1] += _met(s)
    series = [
        {"at": start + i * SERIES_BUCKET_S, "answered": answered, "met": met}
        for i, (answered, met) in enumerate(buckets)
    ]
    return {"windows": windows, "series": series}


def _cache_share(summaries: Iterable[RequestSummary]) -> list[dict[str, Any]]:
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for s in summaries:
        if s.worker and s.prompt_tokens > 0:
            totals[s.worker][0] += s.prompt_tokens
            totals[s.worker][1] += s.cached_tokens
    return [
        {
            "worker": worker,
            "prompt_tokens": prompt,
            "cached_tokens": cached,
            "share": round(cached / prompt, 4),
        }
        for worker, (prompt, cached) in sorted(totals.items())
    ]


def _counts(summaries: Sequence[RequestSummary]) -> dict[str, int]:
    return {
        "answered": sum(_admitted(s) for s in summaries),
        "ok": sum(s.outcome == "ok" for s in summaries),
        "degraded": sum(bool(s.degraded or s.cuts) for s in summaries if _admitted(s)),
        "rejected": sum(s.refused for s in summaries),
        "errored": sum(s.outcome == "error" for s in summaries),
        "cancelled": sum(s.outcome == "cancelled" for s in summaries),
        "sources_only": sum(s.outcome == "sources_only" for s in summaries),
        "abstained": sum(s.outcome == "abstained" for s in summaries),
    }


def _forms(answered: Sequence[RequestSummary]) -> dict[str, Any]:
    forms = Counter(_form_of(s) for s in answered)
    modes = Counter(s.mode or UNKNOWN_FORM for s in answered)
    finish = Counter(s.finish_reason or "none" for s in answered)
    generated = [s for s in answered if _served(s) == "model"]
    unsupported = sum(s.unsupported_sentences for s in generated)
    with_unsupported = sum(s.unsupported_sentences > 0 for s in generated)
    return {
        "answers": len(answered),
        "mix": [
            {"form": form, "count": forms[form], "share": _share(forms[form], len(answered))}
            for form in _ordered(forms, SERVED_FORMS)
        ],
        "modes": [{"mode": mode, "count": modes[mode]} for mode in _ordered(modes, MODES)],
        "finish": [{"reason": reason, "count": n} for reason, n in sorted(finish.items())],
        "generated": len(generated),
        "repetition_stops": finish["repetition"],
        "unsupported_stops": finish["unsupported"],
        "unsupported_sentences": unsupported,
        "unsupported_rate": round(unsupported / len(generated), 4) if generated else None,
        "answers_with_unsupported": with_unsupported,
        "unsupported_answer_share": _share(with_unsupported, len(generated)),
    }


def request_view(summary: RequestSummary) -> dict[str, Any]:
    view = asdict(summary)
    for name in ("stages", "cuts", "degraded"):
        view[name] = list(view[name])
    return view


def snapshot(summaries: Sequence[RequestSummary], *, now: float, source: str) -> dict[str, Any]:
    """Everything the dashboard draws, from the summaries of the last 15 minutes (any
    order)."""
    ordered = sorted((s for s in summaries if s.at >= now - max(WINDOWS_S)), key=lambda s: s.at)
    answered = [s for s in ordered if not s.refused]
    return {
        "generated_at": now,
        "source": source,
        "replicas": sorted({s.replica for s in ordered}),
        "slo": _slo(ordered, now),
        "ttft": {
            "by_tier": _ttft_groups(answered, lambda s: s.tier, ("premium", "standard")),
            "by_prompt_bucket": _ttft_groups(
                answered,
                lambda s: prompt_bucket(s.prompt_tokens),
                [name for _, name in PROMPT_BUCKETS],
            ),
            "by_cache": _ttft_groups(answered, cache_status, ("hit", "miss")),
            "by_served": _ttft_groups(answered, _served, SERVED),
            "by_form": _ttft_groups(answered, _form_of, SERVED_FORMS),
        },
        "cache_share": _cache_share(answered),
        "counts": _counts(ordered),
        "forms": _forms(answered),
        "requests": [request_view(s) for s in reversed(ordered[-RECENT_REQUESTS:])],
        "planner": [
            {
                "at": s.at,
                "tier": s.tier,
                "passages": s.knobs.passages,
                "rerank_depth": s.knobs.rerank_depth,
                "retrieve_k": s.knobs.retrieve_k,
                "quality": s.quality,
            }
            for s in answered[-PLANNER_POINTS:]
            if s.knobs is not None
        ],
    }
