"""The README and the docs pages point at what is there: every relative link reaches a file, every
`#anchor` a heading of its page (as GitHub spells anchors), and every `ANSWER_` variable the
README names is a setting today or one docs/changelog.md lists as removed."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest
from pydantic import AliasChoices

from answer_service.runtime.settings import REMOVED, Settings

ROOT = Path(__file__).parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def prose(text: str) -> str:
    """The text outside code fences and inline code, where links are links."""
    return _CODE.sub("", _FENCE.sub("", text))


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: its text without markup, lower case, punctuation other
    than `-` and `_` dropped, each space a `-`."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = text.replace("`", "").strip().lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in ("L", "N", "M"))
    return kept.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """A page's anchors; a repeated heading's later ones get -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    found = set()
    for heading in _HEADING.findall(_FENCE.sub("", page.read_text(encoding="utf-8"))):
        base = anchor(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in _LINK.findall(prose(page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, fragment = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: no {path}")
        elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
            broken.append(f"{target}: no heading #{fragment} in {path or page.name}")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_and_anchors_resolve(page: Path) -> None:
    assert broken_links(page) == []


def test_github_anchor_rules() -> None:
    assert anchor("Quality within the SLO") == "quality-within-the-slo"
    assert anchor("SGLang on the CPU: prefix attention") == "sglang-on-the-cpu-prefix-attention"
    assert anchor("`answer-eval` and the [SQuAD](x.md) runs") == "answer-eval-and-the-squad-runs"
    assert anchor("Choosing the form per query: the headroom, measured first") == (
        "choosing-the-form-per-query-the-headroom-measured-first"
    )


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other page\n\n## Stage costs\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md#stage-costs) [gone](missing.md) [bad](other.md#stage-cost) "
        "`[code](nowhere.md)` [web](https://example.com/x)\n"
    )
    assert broken_links(page) == [
        "missing.md: no missing.md",
        "other.md#stage-cost: no heading #stage-cost in other.md",
    ]


def setting_names() -> set[str]:
    names = set()
    for name, field in Settings.model_fields.items():
        names.add(f"ANSWER_{name.upper()}")
        if isinstance(field.validation_alias, AliasChoices):
            names |= {a for a in field.validation_alias.choices if isinstance(a, str)}
    return names


def test_every_answer_variable_the_readme_names_exists_or_is_listed_as_removed() -> None:
    before = (ROOT / "README.md").read_text(encoding="utf-8")
    changelog = (ROOT / "docs" / "changelog.md").read_text(encoding="utf-8")
    readme = before + changelog
    removed = {f"ANSWER_{name.upper()}" for name in REMOVED}
    named = set(re.findall(r"\bANSWER_[A-Z0-9_]*[A-Z0-9]\b", readme))
    assert named - setting_names() - removed == set()
    # A removed one is named in the Changelog, never as a setting to use.
    assert set(re.findall(r"\bANSWER_[A-Z0-9_]*[A-Z0-9]\b", before)) & removed == set()
    assert removed <= set(re.findall(r"\bANSWER_[A-Z0-9_]*[A-Z0-9]\b", changelog))
