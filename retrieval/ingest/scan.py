"""Which files a build reads: the files given, and those under the folders given (recursively).

Files of other types inside a folder (stylesheets, images) are passed over and counted; a file
named on the command line that cannot be read, and anything reached through a symlink that
leads outside the paths given, is skipped with its reason. Each file is read once, however many
ways it is reached, in a stable order (so an interrupted build resumes where it stopped).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from retrieval.ingest.parsers import FileFormat, format_of

# A file over this is skipped with the reason (a JSONL corpus, read line by line, is not): a
# page or a manual is far smaller, and a parser holds the whole file in memory.
MAX_FILE_BYTES = 128 * 2**20


@dataclass(frozen=True, slots=True)
class SourceFile:
    """`shown`: the path users see, also the document's id (the folder given, then the path
    inside it; a file given alone is its name); `relative`: the path inside the folder given,
    which `--source-url` is prefixed to."""

    path: Path
    shown: str
    relative: str
    file_format: FileFormat


@dataclass(frozen=True, slots=True)
class SkippedFile:
    """A path given, or a file found, that made no document. `navigation_only`: a page read
    fine whose text is all navigation (a manual's table of contents), which is not a fault: a
    build that meets only these exits 0, and a sync removes what an earlier version made."""

    path: str
    reason: str
    navigation_only: bool = False


@dataclass(frozen=True, slots=True)
class Scan:
    files: tuple[SourceFile, ...]
    skipped: tuple[SkippedFile, ...]
    other_types: int


def scan(paths: Sequence[Path]) -> Scan:
    roots = [path.resolve() for path in paths]
    files: list[SourceFile] = []
    skipped: list[SkippedFile] = []
    seen: set[Path] = set()
    other_types = 0
    for given, root in zip(paths, roots, strict=True):
        if not root.exists():
            skipped.append(SkippedFile(str(given), "no such file or folder"))
            continue
        folder = (given, root.name) if root.is_dir() else None
        for entry in _entries(given):
            reason, found = _classify(entry, roots, folder)
            if reason is not None:
                skipped.append(SkippedFile(str(entry), reason))
            elif found is None:
                other_types += 1 if not entry.is_dir() else 0
            elif found.path not in seen:
                seen.add(found.path)
                files.append(found)
    return Scan(tuple(files), tuple(skipped), other_types)


def _entries(given: Path) -> Iterator[Path]:
    if not given.is_dir() or given.is_symlink():
        yield given
        return
    for folder, names, file_names in os.walk(given):
        names.sort()
        here = Path(folder)
        for name in names:
            if (here / name).is_symlink():
                yield here / name  # os.walk does not enter it; judged like a file
        for name in sorted(file_names):
            yield here / name


def _classify(
    entry: Path, roots: list[Path], folder: tuple[Path, str] | None
) -> tuple[str | None, SourceFile | None]:
    """(reason it is skipped, None) or (None, the file to read, or None for another type).

    `folder`: the folder given that `entry` was found under, and that folder's own name."""
    target = entry.resolve()
    if entry.is_symlink():
        if not target.exists():
            return "broken symlink", None
        if not any(target == root or target.is_relative_to(root) for root in roots):
            return f"symlink to {target}, outside the paths given", None
        if target.is_dir():
            return None, None  # its files are reached under the folder it points into
    if not target.is_file():
        return None, None
    file_format = format_of(entry)
    if file_format is None:
        if folder is None:  # named on its own
            return (
                f"not a supported type ({entry.suffix or 'no extension'}): "
                "HTML, Markdown, text, PDF or JSONL",
                None,
            )
        return None, None
    size = target.stat().st_size
    if size > MAX_FILE_BYTES and file_format != "jsonl":
        return f"{size / 2**20:.0f} MiB, over the {MAX_FILE_BYTES // 2**20} MiB a file may be", None
    if folder is None:
        return None, SourceFile(target, entry.name, entry.name, file_format)
    given, name = folder
    relative = entry.relative_to(given).as_posix()
    return None, SourceFile(target, f"{name}/{relative}", relative, file_format)
