"""The committed split of the shared question sets into scorer training, planner training and
evaluation (eval/splits/*.json), so that what is learned never sees an evaluation question's
document: SQuAD by article, SciFact by groups of claims that share a relevant abstract."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

SPLITS = Path(__file__).resolve().parents[1] / "splits"
Part = Literal["scorer_training", "planner_training", "evaluation"]
PARTS: tuple[Part, ...] = ("scorer_training", "planner_training", "evaluation")


def squad_articles(part: Part) -> frozenset[str]:
    return frozenset(json.loads((SPLITS / "squad.json").read_text())["parts"][part])


def squad_part_of(gold_passage_id: str) -> Part | None:
    """The part a SQuAD question belongs to, by its gold passage's article."""
    article = gold_passage_id.rsplit("-", 1)[0]
    return next((part for part in PARTS if article in squad_articles(part)), None)


def scifact_claims(part: Part) -> frozenset[str]:
    return frozenset(json.loads((SPLITS / "scifact.json").read_text())["parts"][part])
