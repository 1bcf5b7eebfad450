"""The demo's manual: the PostgreSQL 15 manual's HTML pages as Debian ships them, vendored as
one archive (answer_service/demo_corpus/PROVENANCE-html.txt) and extracted once into the cache,
where the demo indexes the folder as a user's documentation is indexed."""

from __future__ import annotations

import hashlib
import shutil
import tarfile
from pathlib import Path

DEMO_ARCHIVE = Path(__file__).resolve().parents[1] / "demo_corpus" / "postgresql-15-html.tar.xz"
# The pages' folder in the archive: documents are `postgresql-15/NAME.html`.
PAGES_FOLDER = "postgresql-15"
SOURCE_URL = "https://www.postgresql.org/docs/15/"
_DONE = ".extracted"


def manual_pages(cache_dir: Path, archive: Path = DEMO_ARCHIVE) -> Path:
    """The folder of the manual's pages under `cache_dir`, extracted from `archive` unless an
    earlier call extracted this archive whole (a marker written last says so)."""
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()[:16]
    target = cache_dir / "demo_corpus" / digest
    pages = target / PAGES_FOLDER
    if (target / _DONE).is_file():
        return pages
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    with tarfile.open(archive, "r:xz") as tar:
        tar.extractall(target, filter="data")
    (target / _DONE).write_text(f"{archive.name}\n", encoding="utf-8")
    return pages
