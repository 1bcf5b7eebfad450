"""Follow-up questions answered with the rewrite, with the last message alone, and written out
in full by hand (the ceiling), side by side in one run, over the manual's 60 conversations.

    make demo   # builds the manual's index from its HTML at ~/.cache/answer-service/indexes/postgresql-15
    python docs/benchmarks/conversations.py --index ~/.cache/answer-service/indexes/postgresql-15 \
        --out docs/benchmarks/conversations.json

The service's pipeline in-process, built from the service's default settings (hybrid search,
the cross-encoder rerank, the reader, the calibrated planner) on that index, answer cache off
so no variant answers another's repeat. Each turn asks `answer_mode: quote` (what `auto` picks
for SmolLM2-135M almost always, docs/answers.md), so no SGLang is needed and the run measures
what the rewrite changes: what is retrieved and quoted. Per conversation, turn by turn:

- first turns: the question alone;
- each follow-up three ways: `rewrite` (the follow-up with the conversation before it as
  `history`: each earlier question and the answer the service gave it; searched as the
  rewrite makes it, read as asked), `last` (the follow-up alone, what chat did before issue
  42), `standalone` (the hand-written full question, alone).

A turn is right when one of its gold answers is in the answer (case-insensitive) and one of its
gold pages is cited by an answer sentence or is the first source. The rewrite's cost is the
`rewrite` stage timed alone on each follow-up (the index's BM25 weights, warm). Lives here, not
in eval/bench/, because eval/ is at its 7,000-line limit.

The conversations are a development set: the reading split and the rewrite's settings were
chosen on them. `--out` keeps the runs it replaces under `history` (commit, note, summary),
newest first; `--note` says what this run measures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from answer_service.pipeline.events import (
    AnswerRequest,
    CitationEvent,
    DoneEvent,
    SourcesEvent,
    TokenEvent,
)
from answer_service.runtime.components import Components
from answer_service.runtime.settings import Settings
from budget import Deadline
from retrieval.query_rewrite import Conversation, FollowUpRewriter, Turn, UniformWeights

CONVERSATIONS = Path("eval/questions/postgresql-15-conversations.jsonl")
TOKENIZER = Path.home() / ".cache/answer-service/models/smollm2-135m-instruct-bf16"
BUDGET_MS = 3000
VARIANTS = ("rewrite", "last", "standalone")


@dataclass
class Answered:
    text: str = ""
    searched: str = ""
    read: str = ""
    sources: list[str] = field(default_factory=list)
    cited: set[str] = field(default_factory=set)
    form: str = ""
    total_ms: float = 0.0

    def right(self, answers: list[str], pages: list[str]) -> bool:
        text = self.text.lower()
        said = any(a.lower() in text for a in answers)
        first = self.sources[:1]
        return said and bool(set(pages) & (self.cited | set(first)))


async def _answer(components: Components, query: str, history: tuple[Turn, ...]) -> Answered:
    pipeline = components.pipeline
    assert pipeline is not None
    request = AnswerRequest(query, BUDGET_MS, 5, answer_mode="quote", history=history)
    started_s = time.perf_counter()
    prepared = await pipeline.prepare(request, Deadline.after_ms(BUDGET_MS))
    out = Answered(searched=prepared.queries.searched, read=prepared.queries.read)
    numbered: dict[int, str] = {}
    try:
        async for event in pipeline.events(prepared):
            match event:
                case SourcesEvent(sources):
                    out.sources = [s.doc_id for s in sources]
                    numbered = {s.number: s.doc_id for s in sources}
                case TokenEvent(text):
                    out.text += text
                case CitationEvent(citation):
                    out.cited |= {numbered[n] for n in citation.sources if n in numbered}
                case DoneEvent(stats):
                    out.form = stats.form
    finally:
        prepared.close_nowait()
    out.total_ms = (time.perf_counter() - started_s) * 1000.0
    return out


def _record(turn: dict[str, Any], answered: Answered) -> dict[str, Any]:
    return {
        "right": answered.right(turn["answers"], turn["gold_pages"]),
        "searched": answered.searched,
        "read": answered.read,
        "form": answered.form,
        "first_source": answered.sources[0] if answered.sources else None,
        "cited": sorted(answered.cited),
        "answer": answered.text[:300],
        "total_ms": round(answered.total_ms, 1),
    }


async def _run(index: Path, conversations: list[dict[str, Any]]) -> dict[str, Any]:
    settings = Settings(index_dir=index, tokenizer=str(TOKENIZER), answer_cache_ttl_s=0)
    components = Components.create(settings)
    components.start_warm_up()
    await components.wait_ready()
    if components.pipeline is None or components.retriever is None:
        raise SystemExit(f"warm-up failed: {components.warm_up_error}")
    records = []
    try:
        for conversation in conversations:
            history: list[Turn] = []
            turns = []
            for n, turn in enumerate(conversation["turns"]):
                if n == 0:
                    first = await _answer(components, turn["question"], ())
                    turns.append({"first": _record(turn, first)})
                    answer_text = first.text
                else:
                    by_variant = {
                        "rewrite": await _answer(components, turn["question"], tuple(history)),
                        "last": await _answer(components, turn["question"], ()),
                        "standalone": await _answer(components, turn["standalone"], ()),
                    }
                    turns.append({v: _record(turn, a) for v, a in by_variant.items()})
                    answer_text = by_variant["rewrite"].text
                history += [Turn("user", turn["question"]), Turn("assistant", answer_text)]
            records.append({"_id": conversation["_id"], "turns": turns})
        cost = _rewrite_cost(components, conversations)
    finally:
        await components.aclose()
    return {"conversations": records, "rewrite_cost_us": cost}


def _rewrite_cost(components: Components, conversations: list[dict[str, Any]]) -> dict[str, Any]:
    """The rewrite alone on each follow-up (its history as asked), weights warm: microseconds."""
    assert components.retriever is not None
    lexical = components.retriever.index.lexical
    rewriter = FollowUpRewriter(lexical if lexical is not None else UniformWeights())
    asked = []
    for conversation in conversations:
        history: list[Turn] = []
        for turn in conversation["turns"]:
            if history:
                asked.append(Conversation(turn["question"], tuple(history)))
            history.append(Turn("user", turn["question"]))
    for conversation in asked:  # warm: the index's weights of these words remembered
        rewriter.rewrite(conversation)
    times_us = []
    for conversation in asked:
        started_s = time.perf_counter()
        rewriter.rewrite(conversation)
        times_us.append((time.perf_counter() - started_s) * 1e6)
    times_us.sort()
    return {
        "follow_ups": len(times_us),
        "median_us": round(statistics.median(times_us), 1),
        "p95_us": round(times_us[int(0.95 * (len(times_us) - 1))], 1),
        "max_us": round(times_us[-1], 1),
    }


def _summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    firsts = [t["first"] for r in records for t in r["turns"] if "first" in t]
    follow_ups = [t for r in records for t in r["turns"] if "first" not in t]
    right = {v: sum(t[v]["right"] for t in follow_ups) for v in VARIANTS}
    ceiling = right["standalone"] or 1
    median_ms = {
        v: round(statistics.median(t[v]["total_ms"] for t in follow_ups), 1) for v in VARIANTS
    }
    return {
        "first_turns": len(firsts),
        "first_turns_right": sum(t["right"] for t in firsts),
        "follow_ups": len(follow_ups),
        "follow_ups_right": right,
        "follow_ups_right_share": {v: round(right[v] / len(follow_ups), 3) for v in VARIANTS},
        "rewrite_over_ceiling": round(right["rewrite"] / ceiling, 3),
        "last_over_ceiling": round(right["last"] / ceiling, 3),
        "median_answer_ms": median_ms,
    }


def _history(path: Path) -> list[dict[str, Any]]:
    """The runs `path` holds (itself and its history), newest first, without their turns."""
    if not path.exists():
        return []
    earlier = json.loads(path.read_text())
    kept = ("commit", "note", "index", "summary", "rewrite_cost_us")
    return [{k: earlier[k] for k in kept if k in earlier}, *earlier.get("history", [])]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--index", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--note", default="", help="what this run measures, kept in history")
    args = parser.parse_args()
    conversations = [json.loads(line) for line in CONVERSATIONS.read_text().splitlines()]
    result = asyncio.run(_run(args.index, conversations))
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    out = {
        "benchmark": "conversations",
        "commit": commit.strip(),
        "note": args.note,
        "questions": "development set: the variants were chosen on these conversations",
        "machine": platform.machine(),
        "index": str(args.index),
        "answer_mode": "quote",
        "ttft_budget_ms": BUDGET_MS,
        "summary": _summary(result["conversations"]),
        "rewrite_cost_us": result["rewrite_cost_us"],
        "history": _history(args.out),
        "conversations": result["conversations"],
    }
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({"summary": out["summary"], "rewrite_cost_us": out["rewrite_cost_us"]}))


if __name__ == "__main__":
    main()
