"""How much choosing the answer form per question could buy: the per-question oracle against the
best single form, from `answer-eval answers` runs of the same questions in each form.

    python -m eval.calibrate.form_headroom --out eval/results/form-headroom.json \\
        quote=docs/eval/answers-quote.json focused=docs/eval/answers-focused.json \\
        passages-1=docs/eval/answers-passages-1.json ...

Each run must have asked the same questions (same `--sample`/`--seed`/`--part`) at low load.
A question is answered right by a form when its answer holds a gold answer string (an abstention
is a miss). The oracle takes, question by question, the best form; the headroom is its share
right minus the best single form's, with a paired-bootstrap 95% interval over questions; and
for each form, where it alone is right (what a per-query choice must find). The planner's
per-query model is worth building only where this headroom is.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from eval.bench.quality_slo import paired_gain
from eval.commands.answers import read_questions
from eval.lib.paths import SQUAD_DIR, shared
from eval.lib.records import with_records
from eval.lib.results import write_result
from eval.lib.squad_metrics import answer_recall, strip_citations


def right_by_form(
    runs: Mapping[str, Sequence[Mapping[str, Any]]], answers: Mapping[str, Sequence[str]]
) -> tuple[list[str], dict[str, list[bool]]]:
    """The questions every run answered (in a fixed order) and, per run, which it got right."""
    by_run = {name: {r["question_id"]: r for r in records} for name, records in runs.items()}
    common = sorted(set.intersection(*(set(r) for r in by_run.values())))
    right: dict[str, list[bool]] = {}
    for name, records in by_run.items():
        right[name] = [
            records[q]["status"] == "ok"
            and records[q].get("form") != "abstain"
            and answer_recall(strip_citations(records[q]["answer"] or ""), answers[q]) > 0
            for q in common
        ]
    return common, right


def headroom(
    right: Mapping[str, Sequence[bool]], resamples: int = 2000, seed: int = 0
) -> dict[str, Any]:
    names = list(right)
    n = len(right[names[0]])
    share = {name: sum(right[name]) / n for name in names}
    best = max(names, key=lambda name: share[name])
    oracle = [any(right[name][i] for name in names) for i in range(n)]
    gain = paired_gain(oracle, right[best], resamples, seed)
    alone = {
        name: sum(
            right[name][i] and not any(right[o][i] for o in names if o != name) for i in range(n)
        )
        / n
        for name in names
    }
    beats_best = {
        name: sum(right[name][i] and not right[best][i] for i in range(n)) / n
        for name in names
        if name != best
    }
    return {
        "questions": n,
        "share_right": {name: round(share[name], 4) for name in names},
        "best_single": best,
        "oracle": round(sum(oracle) / n, 4),
        "headroom": gain["gain"],
        "headroom_ci95": [
            gain["ci95_low"],
            gain["ci95_high"],
        ],
        "right_only_in": {name: round(v, 4) for name, v in alone.items()},
        "right_where_best_is_not": {name: round(v, 4) for name, v in beats_best.items()},
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eval.calibrate.form_headroom")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--questions", type=Path, default=None, help="default: shared SQuAD")
    parser.add_argument("runs", nargs="+", help="NAME=answers-result.json")
    args = parser.parse_args(argv)
    runs: dict[str, list[dict[str, Any]]] = {}
    files: dict[str, str] = {}
    for spec in args.runs:
        name, _, path = spec.partition("=")
        if not path:
            parser.error(f"{spec!r}: expected NAME=FILE")
        result = json.loads(Path(path).read_text(encoding="utf-8"))
        runs[name] = with_records(result, Path(path).parent)["requests"]
        files[name] = path
    questions = read_questions(args.questions or shared(SQUAD_DIR / "questions.jsonl"))
    answers = {q.question_id: q.answers for q in questions}
    _, right = right_by_form(runs, answers)
    metrics = headroom(right)
    write_result(
        args.out, "calibrate-form-headroom", {"runs": files}, {"questions": "SQuAD"}, metrics
    )
    print(json.dumps(metrics, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
