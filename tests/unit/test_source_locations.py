"""A source carries its section's URL and heading path from the passage to every surface that
shows it: the `sources` payload, `/v1/retrieve` and `/v1/passages`, the answer cache, chat's
`citations`/`search_results` and Responses' `url_citation`. A passage without them (from JSONL)
shows what it showed before: no URL, no headings, the passage id or the service's own URL."""

from __future__ import annotations

import json

from answer_service.http.openai_chat import _search_results
from answer_service.http.responses import ResponseShape
from answer_service.http.schemas import PassageOut, RetrievedOut, SourceOut
from answer_service.pipeline.attribution import Citation
from answer_service.pipeline.events import CachedAnswer, Source
from answer_service.pipeline.values import ranked_sources
from retrieval.passage import Passage, ScoredPassage

URL = "https://docs.example.org/guide/vacuum.html#autovacuum-tuning"
HEADINGS = ("Vacuum Guide", "Autovacuum", "Tuning the daemon")
SECTION = Passage(
    "guide#1", "guide", 1, "Vacuum Guide", "Raise autovacuum_max_workers.", 0, 29,
    heading_path=HEADINGS, path="docs/guide.html", anchor="autovacuum-tuning", url=URL,
)  # fmt: skip
JSONL = Passage("Tea-0#0", "Tea-0", 0, "Tea", "Green tea steeps for two minutes.", 0, 33)


def sources() -> tuple[Source, ...]:
    return ranked_sources([ScoredPassage(SECTION, 0.9), ScoredPassage(JSONL, 0.5)], 5, 300)


def passage_url(passage_id: str) -> str:
    return f"http://answers.test/v1/passages/{passage_id}"


def test_a_source_carries_its_section_s_url_and_heading_path() -> None:
    section, jsonl = sources()
    assert (section.url, section.heading_path) == (URL, HEADINGS)
    assert (jsonl.url, jsonl.heading_path) == (None, ())


def test_the_sources_payload_shows_them_or_null() -> None:
    section, jsonl = (SourceOut.of(s).model_dump() for s in sources())
    assert section["url"] == URL
    assert section["heading_path"] == list(HEADINGS)
    assert jsonl["url"] is None
    assert jsonl["heading_path"] is None


def test_retrieved_and_fetched_passages_show_them() -> None:
    retrieved = RetrievedOut.of(SECTION, 0.9)
    assert (retrieved.url, retrieved.heading_path) == (URL, list(HEADINGS))
    fetched = PassageOut.of(JSONL).model_dump(exclude_none=True)
    assert set(fetched) == {"id", "doc_id", "title", "text"}  # as the route sends it


def test_a_cached_answer_keeps_them_and_reads_entries_written_without_them() -> None:
    answer = CachedAnswer(
        text="Raise autovacuum_max_workers. [1]",
        sources=sources(),
        citations=(Citation(0, 0, 29, (1,), 0.9, True),),
        completion_tokens=0,
        finish_reason="stop",
        form="quote",
    )
    assert CachedAnswer.from_bytes(answer.to_bytes()) == answer
    old = json.loads(answer.to_bytes())
    for source in old["sources"]:
        del source["url"], source["heading_path"]
    back = CachedAnswer.from_bytes(json.dumps(old).encode())
    assert [(s.url, s.heading_path) for s in back.sources] == [(None, ()), (None, ())]
    assert [s.passage_id for s in back.sources] == ["guide#1", "Tea-0#0"]


def test_chat_lists_the_section_url_else_the_passage_id() -> None:
    results = _search_results(sources())
    assert [r["url"] for r in results] == [URL, "Tea-0#0"]
    assert results[0]["title"] == "Vacuum Guide"


def test_a_url_citation_uses_the_section_url_else_the_service_s() -> None:
    shape = ResponseShape("t", "m", sources(), passage_url, created_at=1)
    both = Citation(0, 0, 29, (1, 2), 0.9, True)
    assert [a.url for a in shape.annotations(both)] == [URL, passage_url("Tea-0#0")]
    snapshot = shape.snapshot("completed", [])
    assert [r.url for r in snapshot.search_results] == [URL, passage_url("Tea-0#0")]
