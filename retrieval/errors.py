"""Errors raised by `retrieval/`.

    RetrievalError                 base of everything below
    ├── CorpusFormatError          a line of a corpus, queries or qrels file is invalid (with its number)
    ├── UnreadableFileError        a file given to `index build` cannot be indexed (with the reason);
    │                              the build lists it and goes on
    ├── IndexNotFoundError         no index (or no manifest) in the given directory
    ├── IndexMismatchError         the saved index does not match the embedder or corpus in use
    ├── IndexBusyError             another build or sync is writing the index directory
    └── RetrievalTimeoutError      a stage could not finish before its deadline

Third-party errors (faiss, torch, I/O) are wrapped at the boundary with `raise ... from exc`.
"""

from __future__ import annotations

from pathlib import Path


class RetrievalError(Exception):
    """Base class for retrieval failures."""


class CorpusFormatError(RetrievalError):
    def __init__(self, path: Path, line_no: int, reason: str) -> None:
        super().__init__(f"{path}:{line_no}: {reason}")
        self.path = path
        self.line_no = line_no
        self.reason = reason


class UnreadableFileError(RetrievalError):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class IndexNotFoundError(RetrievalError):
    pass


class IndexMismatchError(RetrievalError):
    pass


class IndexBusyError(RetrievalError):
    pass


class RetrievalTimeoutError(RetrievalError):
    pass
