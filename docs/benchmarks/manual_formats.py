"""The manual indexed from its JSONL against the manual indexed from its HTML, side by side in
one run, on the development questions (eval/questions/postgresql-15.jsonl; never the test set).

    python docs/benchmarks/manual_formats.py --every 20 --work /tmp/formats \
        --out docs/benchmarks/manual-formats.json

The same pages both ways: every development question's gold page, and every `--every`th page of
the 1,169 as distractors (`--every 1`: the whole manual). The JSONL lines of those pages
(answer_service/demo_corpus/postgresql-15-docs.jsonl.gz) are built as a JSONL corpus; their HTML
files (postgresql-15-html.tar.xz) as a folder with `--source-url`, as the demo builds them.
Each index's build phases are timed (retrieval/progress.py's `phase done` lines). Then each
index answers every development question in-process with `answer_mode quote` (`answer-eval
answers`): `answer_recall` (a gold string in the quote) and `gold_in_sources` (the gold page
among the sources). The JSONL run reads the questions with their gold ids mapped back to the
JSONL's page names. A quote needs no model, so SGLang is the repository's fake (tests/fakes)
with SmolLM2's tokenizer (`--tokenizer`): the pipeline warms up without a server's minutes.
`--reuse`: an index built before in `--work` (its `build-NAME.json` beside it) is kept.
Lives here, not in eval/bench/, because eval/ is at its line limit.
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from answer_service.cli.manual import PAGES_FOLDER, SOURCE_URL, manual_pages
from retrieval.embedder import EmbedderConfig, SentenceTransformerEmbedder
from retrieval.index.builder import build_index
from retrieval.ingest.source import IngestOptions, open_source
from tests.fakes.fake_sglang import FakeSGLangState, create_fake_sglang
from tests.support import serve_in_thread

JSONL = Path("answer_service/demo_corpus/postgresql-15-docs.jsonl.gz")
QUESTIONS = Path("eval/questions/postgresql-15.jsonl")
_SMOLLM2 = Path.home() / ".cache/answer-service/models/smollm2-135m-instruct-bf16"
_PHASE = re.compile(r"phase done phase=(.+) count=(\d+) seconds=([\d.]+)")


class _Phases(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.phases: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        if match := _PHASE.match(record.getMessage()):
            phase, count, seconds = match.groups()
            self.phases.append({"phase": phase, "count": int(count), "seconds": float(seconds)})


def _page(doc_id: str) -> str:
    return Path(doc_id).stem


def _chosen(every: int, questions: list[dict[str, Any]], names: list[str]) -> list[str]:
    gold = {_page(q["gold_passage_id"]) for q in questions if q["gold_passage_id"]}
    return [name for n, name in enumerate(names) if name in gold or n % every == 0]


def _build(name: str, source: Any, out: Path) -> dict[str, Any]:
    phases = _Phases()
    logging.getLogger("retrieval.progress").addHandler(phases)
    started_s = time.monotonic()
    embedder = SentenceTransformerEmbedder(EmbedderConfig())
    report = build_index(source, out, embedder, force=True)
    logging.getLogger("retrieval.progress").removeHandler(phases)
    return {
        "format": name,
        "passages": report.manifest.passage_count,
        "documents": report.documents,
        "skipped": [f"{s.path}: {s.reason}" for s in report.skipped],
        "build_s": round(time.monotonic() - started_s, 1),
        "phases": phases.phases,
        "load_1min_after": os.getloadavg()[0],
    }


def _answer(index: Path, questions: Path, out: Path, sglang_url: str) -> dict[str, Any]:
    command = [
        sys.executable,
        "-m",
        "eval.commands.main",
        "answers",
        "--questions",
        str(questions),
        "--index",
        str(index),
        "--answer-mode",
        "quote",
        "--sglang-url",
        sglang_url,
        "--out",
        str(out),
    ]
    subprocess.run(command, check=True)
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def _summary(result: dict[str, Any]) -> dict[str, Any]:
    """The run's headline numbers from `answer-eval answers`' metrics."""
    metrics = result["metrics"]
    keys = ("answer_recall", "gold_in_sources", "citation_precision", "false_abstention_rate")
    return {**{key: metrics[key] for key in keys}, "by_form": metrics["by_form"]}


def _per_question(questions: list[dict[str, Any]], runs: dict[str, Any]) -> list[dict[str, Any]]:
    """Each question's quote, both ways: whether it holds an answer, and the gold page found."""
    rows = []
    for question in questions:
        row: dict[str, Any] = {"id": question["_id"]}
        gold = question["gold_passage_id"] and _page(question["gold_passage_id"])
        for name, result in runs.items():
            asked = next(r for r in result["requests"] if r["question_id"] == question["_id"])
            answer = (asked["answer"] or "").lower()
            row[name] = {
                "holds_answer": any(a.lower() in answer for a in question["answers"]),
                "gold_in_sources": gold in {_page(d) for d in asked["source_doc_ids"]},
                "form": asked["form"],
            }
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--every", type=int, default=20, help="every Nth page as a distractor")
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tokenizer", default=str(_SMOLLM2))
    parser.add_argument("--reuse", action="store_true", help="keep indexes built in --work")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("retrieval.progress").setLevel(logging.INFO)
    args.work.mkdir(parents=True, exist_ok=True)
    questions = [json.loads(line) for line in QUESTIONS.read_text().splitlines()]
    with gzip.open(JSONL, "rt", encoding="utf-8") as lines:
        pages = {page["_id"]: page for page in map(json.loads, lines)}
    html = manual_pages(args.work / "cache")
    chosen = _chosen(args.every, questions, sorted(pages))
    corpus = args.work / "manual.jsonl"
    corpus.write_text("".join(json.dumps(pages[name]) + "\n" for name in chosen))
    folder = args.work / "html" / PAGES_FOLDER
    shutil.rmtree(folder.parent, ignore_errors=True)
    folder.mkdir(parents=True)
    for name in chosen:
        shutil.copy(html / f"{name}.html", folder / f"{name}.html")
    flat_questions = args.work / "questions-jsonl.jsonl"
    flat_questions.write_text(
        "".join(
            json.dumps(
                {**q, "gold_passage_id": q["gold_passage_id"] and _page(q["gold_passage_id"])}
            )
            + "\n"
            for q in questions
        )
    )
    runs: list[dict[str, Any]] = []
    answered: dict[str, dict[str, Any]] = {}
    fake = create_fake_sglang(FakeSGLangState(model_path=args.tokenizer))
    with serve_in_thread(fake) as sglang_url:
        for name, source, asked in (
            ("jsonl", open_source([corpus]), flat_questions),
            ("html", open_source([folder], IngestOptions(source_url=SOURCE_URL)), QUESTIONS),
        ):
            index, record = args.work / f"index-{name}", args.work / f"build-{name}.json"
            if args.reuse and record.is_file() and (index / "manifest.json").is_file():
                built = json.loads(record.read_text())
            else:
                built = _build(name, source, index)
                record.write_text(json.dumps(built))
            answered[name] = _answer(index, asked, args.work / f"answers-{name}.json", sglang_url)
            runs.append({**built, **_summary(answered[name])})
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    result = {
        "command": f"python docs/benchmarks/manual_formats.py --every {args.every}",
        "commit": commit,
        "machine": f"{os.cpu_count()} cores, shared with other sessions' work",
        "reranker": os.environ.get("ANSWER_RERANKER_MODEL", "(the default)") or "off",
        "questions": str(QUESTIONS),
        "pages": len(chosen),
        "runs": runs,
        "questions_both_ways": _per_question(questions, answered),
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
