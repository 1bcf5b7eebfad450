"""The fields of the service's SSE events that the load engine (`eval/lib/load_engine.py`) reads, validated
at the edge. Every field is optional and unknown ones are ignored, so an older or newer service
still gets measured; a field of the wrong type fails validation (`pydantic.ValidationError`, a
`ValueError`), which the engine records as a malformed event."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict


class DoneStats(BaseModel):
    """The `done` event's fields the load generator reads."""

    model_config = ConfigDict(extra="ignore")

    outcome: str | None = None
    ttft_ms: float | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    timings_ms: dict[str, float] | None = None
    stages: dict[str, float] | None = None
    passages_in_prompt: int | None = None
    # The form that answered: quote, focused, passages, abstain, sources_only.
    form: str | None = None
    # The quote's short answer (`{text, start, end}`), where there was one.
    short_answer: dict[str, object] | None = None
    wasted_prefill_tokens: int | None = None

    def stages_ms(self) -> tuple[tuple[str, float], ...]:
        stages = self.timings_ms or self.stages or {}
        return tuple((name.removesuffix("_ms"), value) for name, value in stages.items())


class PlanChoices(BaseModel):
    """The `plan` event's fields the load generator keeps: what the service chose to do."""

    model_config = ConfigDict(extra="ignore")

    planner: bool | None = None
    rerank_depth: int | None = None
    passages: int | None = None
    retrieve_k: int | None = None
    cuts: list[Any] | None = None

    def fields(self) -> dict[str, Any]:
        """The record's `plan_*` fields; a cut that is not a string is kept as its JSON."""
        cuts = None
        if self.cuts is not None:
            cuts = tuple(
                cut if isinstance(cut, str) else json.dumps(cut, sort_keys=True)
                for cut in self.cuts
            )
        return {
            "plan_planner": self.planner,
            "plan_rerank_depth": self.rerank_depth,
            "plan_passages": self.passages,
            "plan_retrieve_k": self.retrieve_k,
            "plan_cuts": cuts,
        }
