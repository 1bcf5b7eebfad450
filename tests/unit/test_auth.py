"""API key files, constant-time lookup, the in-process token bucket and open-answer counts."""

from __future__ import annotations

import argparse
import json
import stat
from pathlib import Path

import pytest

from answer_service.cli.keys import add_keys_commands
from answer_service.runtime.keys.auth import (
    ApiKey,
    ApiKeyFileError,
    KeyRing,
    StreamCounts,
    digest,
    new_key,
    read_api_keys,
    write_api_keys,
)
from answer_service.runtime.keys.rate_limit import LocalBuckets


def test_a_key_file_keeps_digests_only_and_reads_back(tmp_path: Path) -> None:
    key = new_key()
    assert key.startswith("ask_")
    assert len(key) > 40
    path = tmp_path / "keys.json"
    written = [ApiKey("team-a", digest(key), "premium", 2.0, 4, 3)]
    write_api_keys(path, written)
    assert key not in path.read_text()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_api_keys(path) == written


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("not json", "cannot read"),
        ('{"nokeys": []}', "expected"),
        ('{"keys": [{"id": "a", "tier": "standard"}]}', "sha256"),
        ('{"keys": [{"id": "a", "sha256": "abc", "tier": "standard"}]}', "64 hex digits"),
        (
            json.dumps({"keys": [{"id": "a", "sha256": "0" * 64, "tier": "s", "burst": 0}]}),
            "positive",
        ),
        (json.dumps({"keys": [{"id": "a", "sha256": "0" * 64, "tier": "s"}] * 2}), "distinct"),
    ],
)
def test_a_bad_key_file_is_refused_with_its_reason(
    tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "keys.json"
    path.write_text(content)
    with pytest.raises(ApiKeyFileError, match=message):
        read_api_keys(path)


def test_the_ring_finds_the_key_whose_digest_matches() -> None:
    keys = [ApiKey(f"k{n}", digest(f"secret-{n}"), "standard") for n in range(5)]
    ring = KeyRing(keys)
    assert ring.find("secret-3") == keys[3]
    assert ring.find("secret-9") is None
    assert ring.find("") is None


def test_the_local_bucket_allows_the_burst_then_the_rate() -> None:
    now = [0.0]
    buckets = LocalBuckets(clock=lambda: now[0])
    key = ApiKey("k", "0" * 64, "standard", rate_per_s=2.0, burst=3)
    assert [buckets.take(key)[0] for _ in range(3)] == [True, True, True]
    allowed, wait_s = buckets.take(key)
    assert not allowed
    assert wait_s == pytest.approx(0.5)
    now[0] = 0.5
    assert buckets.take(key)[0]
    now[0] = 100.0  # refills to the burst, not beyond
    assert [buckets.take(key)[0] for _ in range(4)] == [True, True, True, False]


def test_open_answers_are_counted_per_key() -> None:
    counts = StreamCounts()
    key = ApiKey("k", "0" * 64, "standard", max_streams=2)
    assert counts.try_open(key)
    assert counts.try_open(key)
    assert not counts.try_open(key)
    counts.close(key)
    assert counts.open_count(key) == 1
    assert counts.try_open(key)


def test_keys_add_list_and_revoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    add_keys_commands(parser.add_subparsers(dest="command"))
    path = tmp_path / "keys.json"

    def run(*argv: str) -> int:
        args = parser.parse_args(["keys", *argv])
        code: int = args.run(args)
        return code

    assert (
        run("add", "--file", str(path), "--all-collections", "--id", "team-a", "--tier", "premium")
        == 0
    )
    key = capsys.readouterr().out.strip()
    assert KeyRing(read_api_keys(path)).find(key) is not None
    assert run("add", "--file", str(path), "--all-collections", "--id", "team-a") == 2
    assert run("list", "--file", str(path)) == 0
    listed = capsys.readouterr().out
    assert "team-a\ttier=premium" in listed
    assert key not in listed
    assert run("revoke", "--file", str(path), "--id", "team-a") == 0
    assert read_api_keys(path) == []


def test_keys_add_refuses_a_tier_the_service_does_not_serve(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    parser = argparse.ArgumentParser()
    add_keys_commands(parser.add_subparsers(dest="command"))
    path = tmp_path / "keys.json"

    def run(*argv: str) -> int:
        args = parser.parse_args(["keys", *argv])
        code: int = args.run(args)
        return code

    assert (
        run("add", "--file", str(path), "--all-collections", "--id", "team-g", "--tier", "gold")
        == 2
    )
    assert "tier 'gold' is not one of ['premium', 'standard']" in capsys.readouterr().err
    assert not path.exists()
    monkeypatch.setenv("ANSWER_TIER_WEIGHTS", '{"gold": 2, "standard": 1}')
    assert (
        run("add", "--file", str(path), "--all-collections", "--id", "team-g", "--tier", "gold")
        == 0
    )
    assert [k.tier for k in read_api_keys(path)] == ["gold"]


def test_keys_add_admin(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    add_keys_commands(parser.add_subparsers(dest="command"))
    path = tmp_path / "keys.json"

    def run(*argv: str) -> int:
        args = parser.parse_args(["keys", *argv])
        code: int = args.run(args)
        return code

    assert run("add", "--file", str(path), "--all-collections", "--id", "ops", "--admin") == 0
    assert run("add", "--file", str(path), "--all-collections", "--id", "team") == 0
    assert [(k.key_id, k.admin) for k in read_api_keys(path)] == [("ops", True), ("team", False)]
    capsys.readouterr()
    assert run("list", "--file", str(path)) == 0
    listed = capsys.readouterr().out.splitlines()
    assert listed[0].endswith("\tadmin")
    assert not listed[1].endswith("\tadmin")


def test_keys_add_needs_its_collections_and_old_keys_read_every_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = argparse.ArgumentParser()
    add_keys_commands(parser.add_subparsers(dest="command"))
    path = tmp_path / "keys.json"

    def run(*argv: str) -> int:
        args = parser.parse_args(["keys", *argv])
        code: int = args.run(args)
        return code

    with pytest.raises(SystemExit):
        run("add", "--file", str(path), "--id", "none")
    assert "one of the arguments --collections --all-collections is required" in (
        capsys.readouterr().err
    )
    with pytest.raises(SystemExit):
        run("add", "--file", str(path), "--id", "both", "--collections", "a", "--all-collections")
    assert run("add", "--file", str(path), "--id", "empty", "--collections", " , ") == 2
    assert "at least one collection" in capsys.readouterr().err
    assert run("add", "--file", str(path), "--id", "ab", "--collections", "a, b") == 0
    assert run("add", "--file", str(path), "--id", "all", "--all-collections") == 0
    keys = {k.key_id: k for k in read_api_keys(path)}
    assert keys["ab"].collections == frozenset({"a", "b"})
    assert keys["ab"].may_read("a")
    assert not keys["ab"].may_read("c")
    assert keys["all"].collections is None
    assert json.loads(path.read_text())["keys"][0]["collections"] == ["a", "b"]
    capsys.readouterr()
    assert run("list", "--file", str(path)) == 0
    assert "collections=a,b" in capsys.readouterr().out
    # A key file written before collections existed: its keys read every collection.
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"keys": [{"id": "k", "sha256": "0" * 64, "tier": "standard"}]}))
    assert read_api_keys(old)[0].collections is None
    old.write_text(
        json.dumps({"keys": [{"id": "k", "sha256": "0" * 64, "tier": "x", "collections": "a"}]})
    )
    with pytest.raises(ApiKeyFileError, match="collections must be a list"):
        read_api_keys(old)


def test_a_request_reads_its_filters_within_its_key_s_collections() -> None:
    from answer_service.errors import ForbiddenError
    from answer_service.http.answering import passage_filter
    from answer_service.http.schemas import FiltersIn
    from retrieval.search.filters import PassageFilter

    limited = ApiKey("a", "0" * 64, "standard", collections=frozenset({"a", "b"}))
    every = ApiKey("all", "1" * 64, "standard")
    assert passage_filter(None, None) is None
    assert passage_filter(None, every) is None
    assert passage_filter(None, limited) == PassageFilter(collections=frozenset({"a", "b"}))
    asked = FiltersIn(collection="a", path_prefix="guide/", tags=["ops"])
    assert passage_filter(asked, limited) == PassageFilter(
        frozenset({"a"}), "guide/", frozenset({"ops"})
    )
    assert passage_filter(FiltersIn(tags=["x"]), limited) == PassageFilter(
        frozenset({"a", "b"}), None, frozenset({"x"})
    )
    assert passage_filter(FiltersIn(collection=["c"]), None) == PassageFilter(frozenset({"c"}))
    with pytest.raises(ForbiddenError, match=r"may not read collection\(s\) \['c'\]"):
        passage_filter(FiltersIn(collection=["a", "c"]), limited)
