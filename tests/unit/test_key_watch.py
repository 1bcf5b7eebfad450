"""The API key file read again when it changes: revocations and additions take effect; a file
that cannot be used keeps the old keys."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from answer_service.runtime.keys.auth import ApiKey, KeyRing, digest, read_api_keys, write_api_keys
from answer_service.runtime.keys.key_watch import KeyFileWatcher

TIERS = ("premium", "standard")
A = ApiKey("a", digest("ask_a"), "standard")
B = ApiKey("b", digest("ask_b"), "premium")


def _write(path: Path, text: str | None) -> None:
    if text is None:
        path.unlink()
    else:
        path.write_text(text)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    keys = tmp_path / "keys.json"
    write_api_keys(keys, [A, B])
    return keys


async def test_a_change_is_read_and_a_bad_file_keeps_the_old_keys(
    path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ring = KeyRing(read_api_keys(path, TIERS))
    watcher = KeyFileWatcher(ring, path, TIERS, every_s=1.0)
    await watcher.check()  # unchanged: not read again
    assert watcher.reloads == 0

    write_api_keys(path, [A])  # B revoked
    await watcher.check()
    assert (ring.find("ask_a"), ring.find("ask_b")) == (A, None)

    caplog.set_level(logging.ERROR)
    gold = {"keys": [{"id": "c", "sha256": "0" * 64, "tier": "gold"}]}
    for broken in ('{"keys": [', json.dumps(gold)):  # half-written; a tier not served
        _write(path, broken)
        await watcher.check()
        await watcher.check()  # logged once per change
        assert ring.find("ask_a") == A
    _write(path, None)  # removed
    await watcher.check()
    assert ring.find("ask_a") == A
    assert len([r for r in caplog.records if "not reloaded" in r.getMessage()]) == 3
    assert "tier 'gold'" in caplog.records[1].getMessage()

    write_api_keys(path, [B])
    await watcher.check()
    assert (ring.find("ask_a"), ring.find("ask_b")) == (None, B)
    assert watcher.reloads == 2
