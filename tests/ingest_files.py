"""The ingest fixtures as a folder to build from: tests/fixtures/ingest/docs copied, with PDFs
written by fpdf2 (a real text layer and outline; a page with no text, as a scan has) and a
symlink that leads outside the folder."""

from __future__ import annotations

import shutil
from pathlib import Path

from fpdf import FPDF

FIXTURES = Path(__file__).parent / "fixtures" / "ingest" / "docs"


def write_manual_pdf(path: Path) -> None:
    """Three pages; outline: Introduction (p1) > Scope (p2), Reference (p3)."""
    pdf = FPDF()
    pdf.set_title("Storage Manual")
    pdf.set_font("helvetica", size=12)
    pages = [
        (0, "Introduction", "The storage manager keeps heap pages in shared buffers."),
        (1, "Scope", "This manual covers tablespaces and the free space map."),
        (0, "Reference", "The fillfactor option leaves room for updates on each page."),
    ]
    for level, heading, text in pages:
        pdf.add_page()
        pdf.start_section(heading, level=level)
        pdf.cell(text=heading, new_x="LMARGIN", new_y="NEXT")
        pdf.multi_cell(w=0, text=text)
    pdf.output(str(path))


def write_scanned_pdf(path: Path) -> None:
    """A page with a drawing and no text layer."""
    pdf = FPDF()
    pdf.add_page()
    pdf.rect(20, 20, 100, 60, style="F")
    pdf.output(str(path))


def ingest_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "docs"
    shutil.copytree(FIXTURES, folder)
    write_manual_pdf(folder / "manual.pdf")
    write_scanned_pdf(folder / "bad" / "scanned.pdf")
    outside = tmp_path / "secret.txt"
    outside.write_text("A file outside the folder given must not be indexed.\n")
    (folder / "bad" / "outside.txt").symlink_to(outside)
    return folder
