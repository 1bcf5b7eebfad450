"""The shared data sets the benchmarks read (`../shared/data` beside the repository; the tests
use the fixtures under `tests/fixtures/`, and what needs the shared sets says so), and their
committed split into scorer training, planner training and evaluation (eval/splits/*.json), so
that what is learned never sees an evaluation question's document: SQuAD by article, SciFact by
groups of claims that share a relevant abstract."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

REPO_ROOT = Path(__file__).resolve().parents[2]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"
SQUAD_DIR = SHARED_DATA / "squad-v1.1-open"
SQUAD_TRAIN_DIR = SHARED_DATA / "squad-v1.1-train"
SCIFACT_DIR = SHARED_DATA / "scifact"


def shared(path: Path) -> Path:
    """`path` under the shared data, or a clear error naming what is missing."""
    if not path.exists():
        raise FileNotFoundError(
            f"{path} is not here: this benchmark reads the shared data sets in {SHARED_DATA}"
        )
    return path


SPLITS = REPO_ROOT / "eval" / "splits"
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
