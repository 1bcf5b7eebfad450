"""Reading the API key file again when it changes, so a revoked key stops working (and a new
one starts) without a restart.

Every `every_s` the watcher compares the file's inode, size and modification time (a `stat`,
in a thread) with what it last read; only a change makes it read and check the file again. A
file that cannot be read or is refused (half-written, a key of an unserved tier, removed)
keeps the keys there were, and is logged once, until it changes again.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Collection
from pathlib import Path

from answer_service.runtime.keys.auth import ApiKeyFileError, KeyRing, read_api_keys

logger = logging.getLogger(__name__)

Signature = tuple[int, int, int]


def file_signature(path: Path) -> Signature | None:
    """The file's inode, size and mtime (ns), or None when it is not there (blocking)."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_ino, info.st_size, info.st_mtime_ns


class KeyFileWatcher:
    def __init__(
        self, ring: KeyRing, path: Path, tiers: Collection[str], *, every_s: float
    ) -> None:
        self._ring = ring
        self._path = path
        self._tiers = tuple(tiers)
        self.every_s = every_s
        self.reloads = 0
        self._seen: Signature | None = file_signature(path)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.every_s)
            await self.check()

    async def check(self) -> None:
        """Read the file again if it changed since it was last read."""
        signature = await asyncio.to_thread(file_signature, self._path)
        if signature == self._seen:
            return
        self._seen = signature
        if signature is None:
            logger.error("API key file not reloaded, keeping the old keys path=%s", self._path)
            return
        try:
            keys = await asyncio.to_thread(read_api_keys, self._path, self._tiers)
        except ApiKeyFileError as exc:
            logger.error(
                "API key file not reloaded, keeping the old keys path=%s error=%s",
                self._path,
                exc,
            )
            return
        self._ring.replace(keys)
        self.reloads += 1
        logger.info("API keys reloaded path=%s keys=%d", self._path, len(keys))
