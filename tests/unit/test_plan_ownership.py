"""Plans are built and changed in budget/ alone (issue 39): every other package asks a plan for
its next one (`RequestPlan.admit`, `after`, `before_rerank`, `after_evidence`, `with_form`, ...)
and holds the value it gets back. This walks the syntax tree of every module outside budget/
for the ways a plan could be made or edited there."""

from __future__ import annotations

import ast
from pathlib import Path

from budget.request_plan import RequestPlan

ROOT = Path(__file__).resolve().parents[2]
# The values a plan is made of: built only where the planner and its decisions live.
PLAN_VALUES = frozenset({"RequestPlan", "Plan", "Knobs", "PlanRecord", "Cut", "StageTimes"})
# A plan's own edits, which its decisions are made of.
PLAN_EDITS = frozenset(
    name for name in vars(RequestPlan) if name.startswith("_") and not name.startswith("__")
)


def plan_edits(source: str) -> list[str]:
    """Where `source` builds or edits a plan: `line: what`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        if name in PLAN_VALUES:
            found.append(f"{node.lineno}: builds a {name}")
        elif name in PLAN_EDITS and isinstance(func, ast.Attribute):
            found.append(f"{node.lineno}: edits a plan with {name}")
        elif name == "replace" and node.args:
            target = ast.unparse(node.args[0]).lower()
            if "plan" in target or "knobs" in target or "actual" in target:
                found.append(f"{node.lineno}: replaces a field of {ast.unparse(node.args[0])}")
    return found


def test_the_check_finds_a_plan_made_or_edited() -> None:
    source = (
        "import dataclasses\n"
        "a = RequestPlan(p, True, 't', 1.0, k)\n"
        "b = plan._cut('rerank', 'why', 0)\n"
        "c = dataclasses.replace(answer.plan, form='quote')\n"
        "d = plan.after('embed', result)\n"
    )
    assert plan_edits(source) == [
        "2: builds a RequestPlan",
        "3: edits a plan with _cut",
        "4: replaces a field of answer.plan",
    ]


def test_no_plan_is_built_or_changed_outside_budget() -> None:
    assert {"_cut", "_spent", "_with_knobs", "_answering"} <= PLAN_EDITS
    found = {
        path.relative_to(ROOT).as_posix(): edits
        for package in ("answer_service", "retrieval", "generation", "eval")
        for path in sorted((ROOT / package).rglob("*.py"))
        if (edits := plan_edits(path.read_text(encoding="utf-8")))
    }
    assert found == {}
