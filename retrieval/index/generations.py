"""An index directory as a series of generations, one of them served, and its one writer.

Layout of an index directory `DIR`:

    DIR/generations/000007/   a whole index (manifest.json, index.faiss, passages.jsonl,
                              bm25/, sentences/, documents.jsonl)
    DIR/current               symlink to generations/000007: the generation served
    DIR/manifest.json         symlink to current/manifest.json, for tools that read it
    .DIR.lock (beside DIR)    held (flock) by the one build or sync writing DIR

A build or a sync writes a new generation beside the served one, then publishes it by
renaming a fresh symlink over `current`: one atomic step, so a reader sees the old generation
or the new one, never a mix, and a writer killed at any point leaves the served one whole.
The generation before the served one is kept (a process may still have it open); older ones
are removed. A directory written before generations existed (the index's files at its top)
is read as it is and turned into this layout by its next build or sync.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
from pathlib import Path
from types import TracebackType

from retrieval.errors import IndexBusyError

logger = logging.getLogger(__name__)

GENERATIONS_DIR = "generations"
CURRENT = "current"
_KEPT = 2  # the served generation and the one before it


def served_generation(index_dir: Path) -> Path:
    """The directory holding the served index's files: `current`'s target, or `index_dir`
    itself for a directory written before generations (or a bare index)."""
    current = index_dir / CURRENT
    return current.resolve() if current.is_symlink() else index_dir


def generation_number(index_dir: Path) -> int:
    """The number of the served generation; 0 for a directory without generations."""
    current = index_dir / CURRENT
    if not current.is_symlink():
        return 0
    try:
        return int(current.resolve().name)
    except ValueError:
        return 0


def publish(index_dir: Path, staged: Path) -> Path:
    """Move the finished index in `staged` into `index_dir` as its next generation and serve
    it (the atomic step is the rename of a new symlink over `current`). Returns its path."""
    index_dir.mkdir(parents=True, exist_ok=True)
    if (index_dir / "manifest.json").exists() and not (index_dir / CURRENT).is_symlink():
        _set_aside_flat_layout(index_dir)
    generations = index_dir / GENERATIONS_DIR
    generations.mkdir(exist_ok=True)
    number = max([_number(path) for path in generations.iterdir()] + [0]) + 1
    target = generations / f"{number:06d}"
    staged.rename(target)
    _fsync_dir(generations)
    _point(index_dir / CURRENT, f"{GENERATIONS_DIR}/{target.name}")
    if not (index_dir / "manifest.json").is_symlink():
        _point(index_dir / "manifest.json", f"{CURRENT}/manifest.json")
    _fsync_dir(index_dir)
    _prune(generations, number)
    logger.info("index generation published dir=%s generation=%d", index_dir, number)
    return target


def _point(link: Path, target: str) -> None:
    fresh = link.with_name(f".{link.name}.{os.getpid()}")
    fresh.unlink(missing_ok=True)
    fresh.symlink_to(target)
    fresh.replace(link)


def _set_aside_flat_layout(index_dir: Path) -> None:
    """Move an index written at the directory's top into generations/000000, so it can be
    pruned like any generation once a newer one is served."""
    old = index_dir / GENERATIONS_DIR / f"{0:06d}"
    old.mkdir(parents=True, exist_ok=True)
    for entry in index_dir.iterdir():
        if entry.name == GENERATIONS_DIR or entry.name.startswith("."):
            continue
        entry.rename(old / entry.name)


def _number(path: Path) -> int:
    try:
        return int(path.name)
    except ValueError:
        return -1


def _prune(generations: Path, served: int) -> None:
    for path in generations.iterdir():
        number = _number(path)
        if 0 <= number <= served - _KEPT:
            shutil.rmtree(path, ignore_errors=True)


def _fsync_dir(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


class WriterLock:
    """The one writer of an index directory: a build, a sync or the service's document API.

    An advisory `flock` on `.DIR.lock` beside it, released when the holder exits or dies; a second
    writer is refused at once with `IndexBusyError` (it does not queue)."""

    def __init__(self, index_dir: Path) -> None:
        self.index_dir = index_dir
        self._descriptor: int | None = None

    def __enter__(self) -> WriterLock:
        lock = self.index_dir.with_name(f".{self.index_dir.name}.lock")
        lock.parent.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            holder = os.pread(descriptor, 64, 0).decode(errors="replace").strip()
            os.close(descriptor)
            raise IndexBusyError(
                f"{self.index_dir} is being written by another build or sync"
                + (f" ({holder})" if holder else "")
                + "; try again when it has finished"
            ) from exc
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, f"pid {os.getpid()}".encode(), 0)
        self._descriptor = descriptor
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self._descriptor is not None:
            os.ftruncate(self._descriptor, 0)
            fcntl.flock(self._descriptor, fcntl.LOCK_UN)
            os.close(self._descriptor)
            self._descriptor = None
