"""The result file every `answer-eval` command writes: its metrics under `metrics`, with the
configuration, dataset counts, software versions and a timestamp beside them."""

from __future__ import annotations

import functools
import importlib.metadata
import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

_PACKAGES = (
    "answer-service",
    "faiss-cpu",
    "sentence-transformers",
    "torch",
    "bm25s",
    "ir-measures",
    "transformers",
    "httpx",
    "numpy",
)


def software_versions() -> dict[str, str]:
    versions = {"python": sys.version.split()[0]}
    for package in _PACKAGES:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


@functools.cache
def measured_at() -> str:
    """The commit the measurement ran at, with `-dirty` when tracked files had changes: read
    once, so a command that asks when it starts (`answer-eval` does) records the code it loaded,
    not a commit made while it ran."""
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{head}-dirty" if dirty else head


def write_result(
    out: Path,
    command: str,
    config: dict[str, Any],
    dataset: dict[str, Any],
    metrics: dict[str, Any],
    extra: dict[str, Any] | None = None,
    commit: str | None = None,
) -> None:
    """Write the result JSON; `extra` adds top-level keys (e.g. the raw per-request records);
    `commit`: `measured_at()` taken before the command wrote any file of its own (else now)."""
    result = {
        "command": command,
        "commit": commit or measured_at(),
        "metrics": metrics,
        "config": config,
        "dataset": dataset,
        "versions": software_versions(),
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
        **(extra or {}),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
