"""Where the sentences of a text are, as character spans into it.

A text is first cut into blocks at blank lines. A block that looks like code (a fenced block, a
synopsis full of brackets, indented lines) is one unit and never split; a list is one unit per
item; prose is split at `.`, `!` or `?` (after any closing quotes or brackets) followed by
white space and something that can start a sentence. A line break inside a prose block is white
space, not a boundary (manuals wrap lines inside sentences). Not a boundary: common
abbreviations ("e.g.", "Dr.", "approx."), single initials ("J. R. R. Tolkien"), a dot inside a
number ("3.14", "v2.1"), a dot inside inline code (`` `pg_stat.activity` ``).

The same rules serve the streamed answer (`SentenceStream`): a sentence is released once the
character after its boundary has arrived, or at the end.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

SpanKind = Literal["prose", "item", "code"]


@dataclass(frozen=True, slots=True)
class SentenceSpan:
    start: int
    end: int
    kind: SpanKind = "prose"


_BLANK = re.compile(r"\n[ \t]*\n\s*")
_FENCE = re.compile(r"^\s*(```|~~~)")
_ITEM = re.compile(r"^[ \t]*(?:[-*•]|\d{1,3}[.)]|[a-z][.)])[ \t]+\S", re.M)
# A candidate boundary: sentence punctuation, closing quotes or brackets, then white space.
_END = re.compile(r"[.!?]+[\"'\u201d\u2019)\]]*(?=\s)")
_STARTS_SENTENCE = re.compile(r"\s+[\"'\u201c\u2018(\[]?[A-Z0-9]")
_ABBREVIATIONS = frozenset(
    [
        "e.g",
        "i.e",
        "etc",
        "vs",
        "cf",
        "al",
        "mr",
        "mrs",
        "ms",
        "dr",
        "prof",
        "st",
        "sr",
        "jr",
        "no",
        "nos",
        "fig",
        "figs",
        "approx",
        "inc",
        "ltd",
        "co",
        "corp",
        "dept",
        "est",
        "jan",
        "feb",
        "mar",
        "apr",
        "jun",
        "jul",
        "aug",
        "sep",
        "sept",
        "oct",
        "nov",
        "dec",
        "u.s",
        "u.k",
        "a.m",
        "p.m",
        "ph.d",
        "resp",
        "vol",
        "vols",
        "ed",
        "eds",
        "op",
        "ca",
    ]
)
# A definition's term is at most this long ("max_connections (integer)"), a function's
# signature as the manual's tables write it at most `_SIGNATURE_WORDS` ("current_setting (
# setting_name text [, missing_ok boolean ] ) → text"): a name, its arguments, its result.
_TERM_WORDS = 12
_SIGNATURE_WORDS = 20
_SIGNATURE = re.compile(r"[A-Za-z_][\w.]*\s?\(.*\) \u2192 \S")
# The first word of the rest of a sentence, not of a sentence.
_RUNS_ON = re.compile(
    r"(?:and|but|or|nor|so|yet|then|which|whose|whom|where|whereas|while|because|although|"
    r"though|unless|until|than|that|if|when|with|without|for|to|of|in|on|at|by|from|as)\b"
)
# A line of a table of contents: a section's number (two levels or more), then its title.
_SECTION_LINE = re.compile(r"\s*\d+(?:\.\d+)+\.?\s+\S")
# The first line of a manual page's footer, above the titles of the pages before and after.
_PAGE_FOOTER = re.compile(r"\s*Prev\s+Up(?:\s+Next)?\s*")
# Markdown's headings: "## Configuration", or a title underlined with = or -.
_MARKED_HEADING = re.compile(r"^#{1,6}\s|\s[=-]{3,}$")
_SECTION_NUMBER = re.compile(r"(?:[A-Z]|\d+)\.(?:\d+\.)*\s")
# A heading's words: plain words, perhaps capitalised ("Early life", "Table-Level Lock Modes"),
# numbers and dashes; a term's are identifiers, keywords in capitals, signatures, options.
_HEADING_WORD = re.compile(
    r"[A-Za-z][a-z'\u2019]*(?:-[A-Za-z][a-z'\u2019]*)*,?|\d[\d.]*|vs\.|[\u2013\u2014:&-]"
)
_WORD_BEFORE = re.compile(r"([A-Za-z][A-Za-z.]*)\.$")
# How a sentence ends: its mark (a colon too: a sentence may lead into what follows), closing
# quotes or brackets, then perhaps reference markers ("[3]", "[citation needed]", ":12").
_ENDS_SENTENCE = re.compile(
    r"[.!?:][\"'\u201d\u2019)\]]*(?:\[[^\]\n]{1,40}\]|:\d+(?:[-\u2013]\d+)?(?:,\s?\d+)*)*\s*$"
)


def open_fence(text: str) -> str:
    """The fence (``` or ~~~) of a code block `text` opens and leaves open, else ""."""
    fences = [m.group(1) for line in text.splitlines() if (m := _FENCE.match(line))]
    return fences[-1] if len(fences) % 2 == 1 else ""


def ends_as_sentence(text: str) -> bool:
    """Whether a prose unit ends as a sentence does; a heading, a label, a definition's term or
    a page's navigation line ("Prev Up Chapter 34. libpq Home Next") does not."""
    return _ENDS_SENTENCE.search(text) is not None


def navigation_blocks(text: str) -> list[tuple[int, int]]:
    """The blocks of `text` that lead elsewhere rather than say something: a table of contents
    (lines that mostly start with a section's number: "14.1.1. EXPLAIN Basics", "14.1.2.
    EXPLAIN ANALYZE") and a page's footer ("Prev Up Next" over the titles of the pages before
    and after). Split as prose they make units like "EXPLAIN ANALYZE 14.1.3." and "Parallel
    Safety Home Chapter 16.", which end with a dot and are no sentence."""
    found = []
    for start, end in _blocks(text):
        lines = [line for line in text[start:end].splitlines() if line.strip()]
        numbered = sum(1 for line in lines if _SECTION_LINE.match(line))
        footer = bool(lines) and _PAGE_FOOTER.fullmatch(lines[0]) is not None
        if footer or (numbered >= 2 and 2 * numbered >= len(lines)):
            found.append((start, end))
    return found


def definition_terms(
    text: str, spans: Sequence[SentenceSpan], *, head: str | None = "", lead: str = ""
) -> list[str]:
    """For each unit of `text` (its `spans`, in order), the term its paragraph defines, on one
    line, or "" where it defines none.

    Reference manuals are written as definition lists: a line "max_connections (integer)" and
    below it the paragraph "Determines the maximum number of concurrent connections to the
    database server. The default is typically 100 connections."; "xmin" and "The identity
    (transaction ID) of the inserting transaction for this row version." Their sentences leave
    out what they are about. The term is the short block of one prose unit right before the
    paragraph that does not end as a sentence does; a section's heading (numbered, Markdown's,
    or capitalised words alone: "Description", "34.7. Canceling Queries in Progress") is not one,
    nor a line before a paragraph that is code, a list or goes on in lower case (a sentence
    running on after an example).

    `head`: where `text` is a window of a longer text, what of the paragraph it starts inside
    lies before it ("" where it starts a paragraph; None where that is not known). A window
    that starts inside a line ("( pid integer ) → boolean") has the line's start put back
    ("pg_cancel_backend "), so the term of the paragraph below it is whole; where the head is
    not known (or holds more than that line's unit) its first unit is no term.

    `lead`: where `text` is a window that starts a paragraph (`head` ""), the block of the
    window before that ends where it starts, which may be the term of its first paragraph
    ("work_mem (integer)" ending one window, "Sets the base maximum amount of memory..."
    starting the next)."""
    cut = head is None or bool(head.strip())
    if head and spans and cut:
        whole = split_sentences(head + text[: spans[0].end])
        if len(whole) == 1:  # the head and the first unit are one unit: shift the text
            text = head + text
            spans = [
                SentenceSpan(0, whole[0].end, whole[0].kind),
                *(SentenceSpan(s.start + len(head), s.end + len(head), s.kind) for s in spans[1:]),
            ]
            cut = False
    terms = [""] * len(spans)
    term = "" if cut or not spans else _lead_term(lead, text[: spans[0].end])
    for i, span in enumerate(spans):
        if i > 0 and _BLANK.search(text, spans[i - 1].end, span.start):
            term = "" if i == 1 and cut else _term_before(text, spans, i)
        terms[i] = term
    return terms


def _lead_term(lead: str, first: str) -> str:
    """The term `lead` (one block, on its own line) gives the paragraph that `first` starts."""
    if not lead.strip() or _BLANK.search(lead.strip()):
        return ""
    joined = f"{lead.strip()}\n\n{first}"
    spans = split_sentences(joined)
    return _term_before(joined, spans, 1) if len(spans) == 2 else ""


def paragraph_start(text: str, end: int) -> int | None:
    """Where the paragraph that `text[:end]` ends in starts (after its blank line), or None
    when no blank line comes before `end`: it starts before `text`."""
    breaks = list(_BLANK.finditer(text, 0, end))
    return breaks[-1].end() if breaks else None


def _term_before(text: str, spans: Sequence[SentenceSpan], first: int) -> str:
    """The term of the paragraph whose first unit is `spans[first]`, or ""."""
    if first == 0 or spans[first].kind != "prose" or not text[spans[first].start].isupper():
        return ""
    before = spans[first - 1]
    own_line = first == 1 or _BLANK.search(text, spans[first - 2].end, before.start)
    line = " ".join(text[before.start : before.end].split())
    # A signature is a term whether the splitter took its brackets for code or not.
    signature = before.kind != "item" and _SIGNATURE.match(line) is not None
    if (
        not own_line
        or (before.kind != "prose" and not signature)
        or len(line.split()) > (_SIGNATURE_WORDS if signature else _TERM_WORDS)
        or ends_as_sentence(line)
        or line.endswith(";")  # a statement: an example, not a term
        or not any(c.isalpha() for c in line)  # a number: a table's cell
        or _heading(line)
    ):
        return ""
    return line


def _heading(line: str) -> bool:
    """Whether a line is a section's heading rather than a term: numbered, marked, or plain
    words that start with a capital ("Description", "Early life and career"). A term names
    something: an identifier ("xmin", "max_connections (integer)"), a keyword in capitals
    ("ACCESS EXCLUSIVE"), a signature, an option ("-h hostname")."""
    return bool(_SECTION_NUMBER.match(line) or _MARKED_HEADING.search(line)) or (
        line[:1].isupper() and all(_HEADING_WORD.fullmatch(word) for word in line.split())
    )


def starts_as_sentence(text: str) -> bool:
    """Whether a prose unit starts as a sentence can: not in a lower-case conjunction or
    relative word ("but then the server sees ...", "which is why ..."), the rest of a sentence
    an example or a code block interrupted. An identifier may start a sentence in lower case
    ("pg_dump only dumps a single database.")."""
    return _RUNS_ON.match(text) is None


def split_sentences(text: str) -> list[SentenceSpan]:
    """The sentences (and code blocks and list items) of `text`, in order, as spans with
    surrounding white space left out."""
    spans: list[SentenceSpan] = []
    for start, end in _blocks(text):
        block = text[start:end]
        if _is_code(block):
            spans.append(SentenceSpan(start, end, "code"))
        elif _is_list(block):
            spans.extend(_items(text, start, end))
        else:
            spans.extend(_prose(text, start, end, "prose"))
    return spans


def _blocks(text: str) -> list[tuple[int, int]]:
    """Blank-line separated blocks, a fenced code block (blank lines and all) kept whole."""
    blocks: list[tuple[int, int]] = []
    at = 0
    fence_open: int | None = None
    for gap in [*_BLANK.finditer(text), None]:
        end = gap.start() if gap is not None else len(text)
        chunk = text[at:end]
        fenced = bool(open_fence(chunk))
        if fence_open is None and fenced:
            fence_open = at
        elif fence_open is not None and fenced:
            blocks.append((fence_open, end))
            fence_open = None
        elif fence_open is None:
            blocks.append((at, end))
        at = gap.end() if gap is not None else len(text)
    if fence_open is not None:
        blocks.append((fence_open, len(text)))
    return [(s, e) for s, e in (_trimmed(text, s, e) for s, e in blocks) if s < e]


def _trimmed(text: str, start: int, end: int) -> tuple[int, int]:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def _is_code(block: str) -> bool:
    if _FENCE.match(block):
        return True
    lines = [line for line in block.splitlines() if line.strip()]
    if not lines:
        return False
    symbols = sum(block.count(c) for c in "{}[]();=<>|")
    words = len(block.split())
    sentence_ends = len(_END.findall(block + " "))
    # A synopsis or a program: dense in brackets and operators, few sentence ends.
    if symbols >= 4 and symbols >= 0.3 * words and sentence_ends <= len(lines) // 2:
        return True
    indented = sum(1 for line in lines if line.startswith(("    ", "\t")))
    return len(lines) >= 2 and indented == len(lines) and sentence_ends == 0


def _is_list(block: str) -> bool:
    lines = [line for line in block.splitlines() if line.strip()]
    items = len(_ITEM.findall(block))
    return items >= 2 and items >= len(lines) // 2


def _items(text: str, start: int, end: int) -> list[SentenceSpan]:
    starts = [start + m.start() for m in _ITEM.finditer(text[start:end])]
    if not starts or starts[0] != start:
        starts = [start, *starts]
    spans: list[SentenceSpan] = []
    for item_start, item_end in zip(starts, [*starts[1:], end], strict=True):
        s, e = _trimmed(text, item_start, item_end)
        if s < e:
            spans.append(SentenceSpan(s, e, "item"))
    return spans


def _prose(text: str, start: int, end: int, kind: SpanKind) -> list[SentenceSpan]:
    spans: list[SentenceSpan] = []
    at = start
    for boundary in boundaries(text, start, end):
        s, e = _trimmed(text, at, boundary)
        if s < e:
            spans.append(SentenceSpan(s, e, kind))
        at = boundary
    s, e = _trimmed(text, at, end)
    if s < e:
        spans.append(SentenceSpan(s, e, kind))
    return spans


def boundaries(text: str, start: int, end: int) -> list[int]:
    """Offsets in `text[start:end]` where a prose sentence ends (just after its punctuation
    and closing quotes); only those with the next sentence's start visible."""
    found: list[int] = []
    segment = text[start:end]
    code_ranges = [(m.start(), m.end()) for m in re.finditer(r"`[^`\n]*`", segment)]
    for match in _END.finditer(segment):
        offset = match.end()
        if any(a < match.start() < b for a, b in code_ranges):
            continue
        if not _STARTS_SENTENCE.match(segment, offset):
            continue
        if match.group().startswith(".") and _abbreviation(segment, match.start() + 1):
            continue
        found.append(start + offset)
    return found


def _abbreviation(segment: str, dot_end: int) -> bool:
    """Whether the dot ending at `dot_end` closes an abbreviation or an initial."""
    before = _WORD_BEFORE.search(segment, 0, dot_end)
    if before is None:
        return False
    word = before.group(1).lower().rstrip(".")
    if word in _ABBREVIATIONS:
        return True
    # A single capital letter ("J." in "J. R. R. Tolkien"); "I." ends a sentence too rarely
    # to matter and "A." mostly in enumerations.
    return len(word) == 1 and before.group(1)[0].isupper()


class SentenceStream:
    """The sentences of a text that arrives in pieces (a streamed answer): `feed` returns the
    sentences finished so far (a boundary counts once the next sentence's start has arrived,
    or a blank line), `finish` the rest. Spans index the whole text."""

    def __init__(self) -> None:
        self.text = ""
        self._done = 0

    def feed(self, piece: str) -> list[SentenceSpan]:
        self.text += piece
        # Only what is closed by a blank line or a visible boundary is final.
        cut = self._final_cut()
        if cut <= self._done:
            return []
        spans = [s for s in split_sentences(self.text[:cut]) if s.start >= self._done]
        self._done = cut
        return spans

    @property
    def open_from(self) -> int:
        """Where the text not yet returned as finished sentences starts."""
        return self._done

    def finish(self) -> list[SentenceSpan]:
        spans = [s for s in split_sentences(self.text) if s.start >= self._done]
        self._done = len(self.text)
        return spans

    def _final_cut(self) -> int:
        text = self.text
        if open_fence(text):
            return self._done
        last_blank = max((m.end() for m in _BLANK.finditer(text, self._done)), default=-1)
        last_blank_start = max((m.start() for m in _BLANK.finditer(text, self._done)), default=-1)
        tail_start = last_blank if last_blank > 0 else self._done
        ends = boundaries(text, tail_start, len(text))
        if ends and not _is_list(text[tail_start:]) and not _is_code(text[tail_start:]):
            return ends[-1]
        return last_blank_start if last_blank_start > 0 else self._done
