"""Where the benchmarks find the shared data sets: `../shared/data` beside the repository.

Only benchmarks and calibration read it (the tests use the fixtures under `tests/fixtures/`);
a clone of the repository alone does not have it, and what needs it says so.
"""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"
SQUAD_DIR = SHARED_DATA / "squad-v1.1-open"
SCIFACT_DIR = SHARED_DATA / "scifact"


def shared(path: Path) -> Path:
    """`path` under the shared data, or a clear error naming what is missing."""
    if not path.exists():
        raise FileNotFoundError(
            f"{path} is not here: this benchmark reads the shared data sets in {SHARED_DATA}"
        )
    return path
