"""Swapping the index while serving: `index build` and `index sync` publish a new generation
(retrieval/index/generations.py), or a deployment flips a symlink to another index directory
with an atomic rename; the service opens
it beside the old one, swaps it in between requests, and closes the old one once the requests
that started on it have had time to finish. No request is dropped; a request under way keeps
the index it started with (answer_service/pipeline/retrieval_steps.py).

The watcher compares the resolved path and the manifest every `index_watch_s`. A directory
that cannot be opened (half-written, another embedder) is logged and the old index kept.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Protocol

from retrieval.embedder import Embedder
from retrieval.errors import RetrievalError
from retrieval.index.generations import served_generation
from retrieval.retriever import Retriever

logger = logging.getLogger(__name__)


class Swappable(Protocol):
    retriever: Retriever | None

    def open_retriever(self, embedder: Embedder) -> Retriever: ...

    def swap_retriever(self, retriever: Retriever) -> Retriever | None: ...


def index_identity(index_dir: Path) -> tuple[str, str]:
    """Which generation `index_dir` serves and what its manifest says (blocking)."""
    served = served_generation(index_dir).resolve()
    return str(served), (served / "manifest.json").read_text()


class IndexWatcher:
    def __init__(
        self, target: Swappable, index_dir: Path, *, every_s: float, grace_s: float
    ) -> None:
        self._target = target
        self._index_dir = index_dir
        self.every_s = every_s
        # How long an old index stays open for the requests that started on it.
        self.grace_s = grace_s
        self.swaps = 0
        self._seen: tuple[str, str] | None = None
        self._checking = asyncio.Lock()
        self._closing: set[asyncio.Task[None]] = set()

    async def remember(self) -> None:
        """Take what `index_dir` serves now as what is being served."""
        self._seen = await self._identity()

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.every_s)
            await self.check()

    async def check(self) -> None:
        """Swap in what `index_dir` serves now if it changed (also called right after this
        process publishes a generation, so its own writes are read at once)."""
        async with self._checking:
            identity = await self._identity()
            if identity is not None and identity != self._seen:
                await self._swap(identity)

    async def _identity(self) -> tuple[str, str] | None:
        try:
            return await asyncio.to_thread(index_identity, self._index_dir)
        except OSError as exc:
            logger.warning("index not readable, keeping the current one error=%s", exc)
            return None

    async def _swap(self, identity: tuple[str, str]) -> None:
        current = self._target.retriever
        if current is None:
            return
        try:
            fresh = await asyncio.to_thread(self._target.open_retriever, current.embedder)
        except (RetrievalError, OSError, ValueError) as exc:
            logger.error("new index could not be opened, keeping the old one error=%s", exc)
            self._seen = identity  # not again until it changes once more
            return
        old = self._target.swap_retriever(fresh)
        self._seen = identity
        self.swaps += 1
        logger.info("index swapped path=%s passages=%d", identity[0], len(fresh.index))
        if old is not None:
            task = asyncio.get_running_loop().create_task(self._close_later(old))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def _close_later(self, old: Retriever) -> None:
        await asyncio.sleep(self.grace_s)
        old.close()
