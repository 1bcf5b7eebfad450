"""The sentence splitter: abbreviations, decimals, initials, wrapped lines, lists and code, and
the streamed splitter giving the same sentences as the whole text."""

from __future__ import annotations

import pytest

from retrieval.sentences.splitter import (
    SentenceStream,
    definition_terms,
    ends_as_sentence,
    navigation_blocks,
    split_sentences,
    starts_as_sentence,
)


def sentences(text: str) -> list[str]:
    return [text[s.start : s.end] for s in split_sentences(text)]


def test_plain_prose_splits_at_sentence_ends() -> None:
    assert sentences("Tea is green. Coffee is brown! Is milk white? Yes.") == [
        "Tea is green.",
        "Coffee is brown!",
        "Is milk white?",
        "Yes.",
    ]


@pytest.mark.parametrize(
    "text",
    [
        "Use a solvent, e.g. ethanol, to clean it.",
        "The value is 3.14 and rises to 4.5 at noon.",
        "J. R. R. Tolkien wrote it in 1937.",
        "Dr. Smith met Mr. Jones at approx. 5 p.m. on the pier.",
        "It moved to the U.S. Army in 1942.",
        "Call `pg_stat.activity. Rows` for the list.",
        "Version v2.1 fixed it.",
    ],
)
def test_no_boundary_inside_abbreviations_numbers_initials_or_code(text: str) -> None:
    assert sentences(text) == [text]


def test_closing_quotes_and_brackets_stay_with_their_sentence() -> None:
    assert sentences('He said "stop." Then he left (quietly.) The end.') == [
        'He said "stop."',
        "Then he left (quietly.)",
        "The end.",
    ]


def test_a_line_break_inside_prose_is_white_space() -> None:
    text = " CREATE INDEX constructs an index on the column(s)\n of the relation.\n Indexes speed queries."
    assert sentences(text) == [
        "CREATE INDEX constructs an index on the column(s)\n of the relation.",
        "Indexes speed queries.",
    ]


def test_a_synopsis_is_one_unit() -> None:
    text = (
        "Synopsis\n\nCREATE [ UNIQUE ] INDEX [ CONCURRENTLY ] [ name ] ON table_name\n"
        " ( { column_name | ( expression ) } [, ...] )\n [ WHERE predicate ]\n\n"
        "Description. It builds an index."
    )
    spans = split_sentences(text)
    assert [s.kind for s in spans] == ["prose", "code", "prose", "prose"]
    assert text[spans[1].start : spans[1].end].endswith("[ WHERE predicate ]")


def test_a_fenced_block_is_one_unit_even_with_blank_lines_and_dots_inside() -> None:
    text = "Run this:\n\n```sql\nSELECT 1.5;\n\nVACUUM FULL t. \n```\n\nDone. Really."
    assert sentences(text) == [
        "Run this:",
        "```sql\nSELECT 1.5;\n\nVACUUM FULL t. \n```",
        "Done.",
        "Really.",
    ]


def test_list_items_are_units() -> None:
    text = "Steps:\n\n- Stop the server.\n- Copy the files. Then check them.\n- Start it."
    spans = split_sentences(text)
    assert [text[s.start : s.end] for s in spans] == [
        "Steps:",
        "- Stop the server.",
        "- Copy the files. Then check them.",
        "- Start it.",
    ]
    assert [s.kind for s in spans[1:]] == ["item", "item", "item"]


SAMPLES = [
    "Tea is green. Coffee is brown! Is milk white? Yes, it is.",
    "Dr. Smith met Mr. Jones. They spoke of 3.14 and e.g. pi.\n\nA new paragraph. Another.",
    "Use this:\n\n```\nSELECT 1;\nSELECT 2.\n```\n\nThen stop. Done.",
    "Steps:\n\n- one thing.\n- two things.\n\nAfter the list. End.",
]


@pytest.mark.parametrize("text", SAMPLES)
@pytest.mark.parametrize("piece", [1, 3, 7])
def test_streamed_pieces_give_the_same_sentences(text: str, piece: int) -> None:
    stream = SentenceStream()
    spans = []
    for at in range(0, len(text), piece):
        spans += stream.feed(text[at : at + piece])
    spans += stream.finish()
    assert spans == split_sentences(text)


def test_a_streamed_sentence_is_released_once_the_next_one_starts() -> None:
    stream = SentenceStream()
    assert stream.feed("Green tea steeps for two minutes.") == []
    assert stream.feed(" ") == []
    (first,) = stream.feed("It")
    assert stream.text[first.start : first.end] == "Green tea steeps for two minutes."


@pytest.mark.parametrize(
    ("text", "ends"),
    [
        ("Sets the maximum number of connections.", True),
        ('He said "no."', True),
        ("The lock is described below (see LOCK).", True),
        ("Use the following command:", True),  # leads into what follows
        ("It sold well.[citation needed]", True),
        ("He graduated in 1873.:33", True),
        ("American National Standards Institute", False),  # a definition's term
        ("Canceling Queries in Progress Prev UpChapter 34. libpq — C LibraryHome Next", False),
        ("Chapter 12 [3]", False),
    ],
)
def test_a_sentence_ends_with_its_mark_and_perhaps_references(text: str, ends: bool) -> None:
    assert ends_as_sentence(text) is ends


def terms_of(text: str) -> dict[str, str]:
    """Each unit's text (on one line) and the term of its paragraph."""
    spans = split_sentences(text)
    return {
        " ".join(text[s.start : s.end].split()): term
        for s, term in zip(spans, definition_terms(text, spans), strict=True)
    }


def test_a_definitions_sentences_carry_the_term_it_defines() -> None:
    """The PostgreSQL manual's settings, columns, functions and lock modes are definition
    lists: a short line of its own, then the paragraph that defines it."""
    text = (
        "max_connections (integer)\n\n Determines the maximum number of concurrent\n"
        " connections. The default is typically 100 connections.\n\n"
        " When running a standby server, set it as high as on the primary.\n\n"
        "pg_cancel_backend ( pid integer )\n → boolean\n\n Cancels the current query.\n"
    )
    assert terms_of(text) == {
        "max_connections (integer)": "",
        "Determines the maximum number of concurrent connections.": "max_connections (integer)",
        "The default is typically 100 connections.": "max_connections (integer)",
        # Only the paragraph right below the term: a later one may be about anything.
        "When running a standby server, set it as high as on the primary.": "",
        "pg_cancel_backend ( pid integer ) → boolean": "",
        "Cancels the current query.": "pg_cancel_backend ( pid integer ) → boolean",
    }


def test_a_functions_signature_is_its_term_though_its_brackets_read_as_code() -> None:
    """The manual's function tables: a signature, then what the function does. Brackets
    make a signature look like a synopsis (code), and its arguments make it longer than a
    setting's line."""
    text = (
        "coalesce ( value [, ...] )\n → anyelement\n\n"
        " Returns the first of its arguments that is not null.\n\n"
        "current_setting ( setting_name text [, missing_ok boolean ] )\n → text\n\n"
        " Returns the current value of the setting setting_name.\n\n"
        "SELECT coalesce(a, b) FROM t;\n\n Returns a value for every row.\n"
    )
    assert split_sentences(text)[0].kind == "code"
    terms = terms_of(text)
    assert terms["Returns the first of its arguments that is not null."] == (
        "coalesce ( value [, ...] ) → anyelement"
    )
    assert terms["Returns the current value of the setting setting_name."] == (
        "current_setting ( setting_name text [, missing_ok boolean ] ) → text"
    )
    assert terms["Returns a value for every row."] == ""  # an example is code, not a term


@pytest.mark.parametrize(
    "before",
    [
        "Description",  # a reference page's section
        "34.7. Canceling Queries in Progress",  # a numbered heading
        "Table 9.88. Server Signaling Functions",  # a caption
        "Table-Level Lock Modes",
        "Early life and career",  # a heading in sentence case, as Wikipedia writes them
        "## configuration_file",  # Markdown's headings
        "the_settings\n============",
        "The default is 100.",  # a sentence, not a term
        "REFRESH MATERIALIZED VIEW order_summary;",  # the example before it
        "a line in a paragraph\nthat is not a term line\nbut the end of a longer block of text",
    ],
)
def test_headings_sentences_and_code_are_not_terms(before: str) -> None:
    text = f"{before}\n\n TRUNCATE quickly removes all rows.\n"
    assert terms_of(text)["TRUNCATE quickly removes all rows."] == ""


def test_a_paragraph_running_on_after_an_example_has_no_term() -> None:
    text = "ssh -L 63333:foo.com:5432 joe@foo.com\n\n but then the server sees a local client.\n"
    assert terms_of(text)["but then the server sees a local client."] == ""


def test_a_window_that_starts_inside_a_line_has_the_lines_start_put_back() -> None:
    """A passage window after a page's first starts wherever the window fell: its first line
    may be the tail of a function's signature, whose name is in the window before."""
    text = "( pid integer, timeout bigint DEFAULT 0 )\n → boolean\n\n Terminates the session.\n"
    spans = split_sentences(text)
    signature = "pg_terminate_backend ( pid integer, timeout bigint DEFAULT 0 ) → boolean"
    assert definition_terms(text, spans, head="pg_terminate_backend ")[-1] == signature
    # What came before is not known: the tail is no term.
    assert definition_terms(text, spans, head=None)[-1] == ""
    # The paragraph began with a sentence before the window: the tail ends it, no term.
    assert definition_terms(text, spans, head="Sends a signal. pg_terminate_backend ")[-1] == ""
    # The window starts the paragraph ("" before it): its first line is whole.
    assert definition_terms(text, spans, head="")[-1] == (
        "( pid integer, timeout bigint DEFAULT 0 ) → boolean"
    )


@pytest.mark.parametrize(
    ("text", "starts"),
    [
        ("The default is 100.", True),
        ("pg_dump only dumps a single database.", True),  # an identifier
        ("xmin is the inserting transaction.", True),
        ("but then the server sees a local client.", False),  # after an example
        ("which is why the lock is taken.", False),
        ("andrew's patch fixed it.", True),  # a word, not "and"
    ],
)
def test_a_sentence_does_not_start_as_the_rest_of_one(text: str, starts: bool) -> None:
    assert starts_as_sentence(text) is starts


def test_a_table_of_contents_is_found_and_prose_with_numbers_is_not() -> None:
    contents = "9.18.1. CASE\n9.18.2. COALESCE\n9.18.3. NULLIF"
    prose = "It was added in PostgreSQL\n9.6. It is faster than before.\nSee 9.18.2 too."
    text = f"{contents}\n\n{prose}\n"
    assert navigation_blocks(text) == [(0, len(contents))]
