"""How a finished answer's form is reported, on `/metrics` and on the dashboard alike.

The form is the pipeline's (`AnswerStats.form`: quote, focused, passages, abstain,
sources_only), except that an answer served whole from the answer cache is reported as
`cached`: it cost no retrieval and no model, whatever form first produced it, and its first
token comes in milliseconds. "Model-served" answers are the ones the model was asked for now:
focused or passages, not from the cache. Their first token takes the model's seconds; every
other form's takes the service's milliseconds, so the two are never timed together.
"""

from __future__ import annotations

# The order the dashboard lists them in; a form not listed here is shown after them.
SERVED_FORMS = ("quote", "focused", "passages", "abstain", "sources_only", "cached")
MODEL_FORMS = frozenset({"focused", "passages"})
# What an answer whose form is not known is reported as (a summary from an older replica).
UNKNOWN_FORM = "unknown"


def served_form(form: str, *, from_cache: bool) -> str:
    if from_cache:
        return "cached"
    return form or UNKNOWN_FORM


def model_served(form: str, *, from_cache: bool) -> bool:
    return not from_cache and form in MODEL_FORMS
