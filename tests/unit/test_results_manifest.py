"""The committed results' manifest (docs/benchmarks/manifest.json): every result file is in it,
each entry's file exists and carries the commit the manifest gives, a result recorded on a
dirty tree is stale, and docs/benchmarks/README.md's tables are the ones it generates."""

from __future__ import annotations

import subprocess

import pytest

from eval.bench.manifest import (
    README,
    SECTIONS,
    Manifest,
    generated_part,
    main,
    read_manifest,
    recorded_commit,
    tables,
)
from eval.lib.data import REPO_ROOT


@pytest.fixture(scope="module")
def manifest() -> Manifest:
    return read_manifest()


def test_the_readme_tables_are_generated_from_the_manifest(manifest: Manifest) -> None:
    assert generated_part(README.read_text(encoding="utf-8")) == tables(manifest)
    assert main(["--check"]) == 0


def test_every_result_file_is_in_the_manifest_once(manifest: Manifest) -> None:
    listed = [r.file for r in manifest.results]
    assert len(listed) == len(set(listed))
    on_disk = {
        str(path.relative_to(REPO_ROOT))
        for section in SECTIONS
        for path in (REPO_ROOT / section).glob("*.json")
        if path.name != "manifest.json"
    }
    assert on_disk == set(listed)


def test_each_entry_carries_its_commit(manifest: Manifest) -> None:
    for result in manifest.results:
        path = REPO_ROOT / result.file
        assert path.is_file(), result.file
        assert all((REPO_ROOT / also).is_file() for also in result.also), result.file
        recorded = recorded_commit(path)
        if result.commit_from == "file":
            assert recorded == result.commit, result.file
        else:
            assert recorded is None, f"{result.file} records {recorded}: take it from the file"


def test_a_result_from_a_dirty_tree_is_stale_and_every_stale_one_says_why(
    manifest: Manifest,
) -> None:
    for result in manifest.results:
        if result.commit.endswith("-dirty"):
            assert result.status == "stale", result.file
        assert (result.status == "stale") == (result.stale_because is not None), result.file


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    ).stdout


def test_a_commit_taken_from_git_wrote_the_file(manifest: Manifest) -> None:
    try:
        shallow = _git("rev-parse", "--is-shallow-repository").strip() == "true"
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("no git history here")
    if shallow:
        pytest.skip("a shallow clone lacks the commits that wrote the results")
    for result in manifest.results:
        if result.commit_from == "git":
            wrote = _git("log", "--format=%h", "--abbrev=7", "--", result.file).split()
            assert result.commit in wrote, result.file
