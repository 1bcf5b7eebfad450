"""Sentence vectors pooled from the passage pass against sentences embedded on their own, side
by side in one run: the build's model time, and the quotes both ways over the same passages.

    python docs/benchmarks/sentence_pooling.py --work /tmp/pooling \
        --out docs/benchmarks/sentence-pooling.json [--squad-sample 300] [--answers-only]

Two development sets, never an evaluation part: the manual's development questions
(eval/questions/postgresql-15.jsonl) over the same 92 pages as `manual_formats.py` (every gold
page and every 20th page, from the HTML folder the demo indexes), and a seeded sample of SQuAD's
planner-training part (eval/splits/squad.json) over its three articles' passages and every 5th
passage of the others. Each corpus is built once as the service builds it (sentence vectors
pooled from the passage pass); the other arm is the same index with every sentence re-embedded
on its own text, as builds did before (each distinct text once, sorted by length, batches of
128). Model time, on the manual: the passage pass with pooling, the same passes without it
(`encode` alone) and the separate sentence pass, each as process CPU seconds and wall seconds
(the machine is shared: CPU seconds are the steadier of the two). Then both arms answer every
question in-process with `answer_mode quote` (`answer-eval answers`, SGLang the repository's
fake with SmolLM2's tokenizer: a quote needs no model). `--before-weights` (the scorer the
separate vectors were fitted with, e.g. from `git show REV:retrieval/sentences/scorer.json`):
also counts, per arm and its own scorer, the share of first passes under the reader's doubt
threshold, which the reader then reads (its cost falls on the quote's first token). Lives here, not in eval/bench/, because
eval/ is at its line limit.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from answer_service.cli.manual import PAGES_FOLDER, SOURCE_URL, manual_pages
from eval.lib.data import SQUAD_DIR
from retrieval.embedder import EmbedderConfig, SentenceTransformerEmbedder, passage_embedding_text
from retrieval.index.builder import build_index
from retrieval.index.faiss_index import read_passages
from retrieval.index.generations import served_generation
from retrieval.ingest.source import IngestOptions, open_source
from retrieval.sentences.store import CODE, SENTENCES_DIR, embed_passages
from tests.fakes.fake_sglang import FakeSGLangState, create_fake_sglang
from tests.support import serve_in_thread

QUESTIONS = Path("eval/questions/postgresql-15.jsonl")
SPLIT = Path("eval/splits/squad.json")
WEIGHTS = Path("retrieval/sentences/scorer.json")
_SMOLLM2 = Path.home() / ".cache/answer-service/models/smollm2-135m-instruct-bf16"


def _timed(work: Callable[[], Any]) -> dict[str, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    work()
    return {
        "cpu_s": round(time.process_time() - cpu, 1),
        "wall_s": round(time.perf_counter() - wall, 1),
    }


def _separate(index: Path, out: Path, embedder: SentenceTransformerEmbedder) -> dict[str, Any]:
    """A copy of `index` whose sentence vectors are each sentence's own text embedded alone."""
    source = served_generation(index)
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(source, out)
    passages = list(read_passages(out / "passages.jsonl"))
    folder = out / SENTENCES_DIR
    spans, offsets = np.load(folder / "spans.npy"), np.load(folder / "offsets.npy")
    vectors = np.zeros((spans.shape[0], embedder.dimension), dtype=np.float16)
    texts: dict[str, list[int]] = {}
    for sentence, (row, start, end, _, flags) in enumerate(spans):
        text = passages[row].text[start:end]
        if not flags & CODE and len(text.split()) >= 3:
            texts.setdefault(text, []).append(sentence)
    distinct = sorted(texts, key=len)

    def embed() -> None:
        for at in range(0, len(distinct), 128):
            chunk = distinct[at : at + 128]
            for text, vector in zip(chunk, embedder.encode(chunk, batch_size=128), strict=True):
                vectors[texts[text]] = vector.astype(np.float16)

    timing = _timed(embed)
    np.save(folder / "vectors.npy", vectors)
    assert offsets[-1] == spans.shape[0]
    return {"sentences_embedded": len(distinct), **timing}


def _passes(index: Path, embedder: SentenceTransformerEmbedder) -> dict[str, Any]:
    """The passage pass with pooling and without, on the index's passages, alternated by
    batch so both meet the same load."""
    passages = list(read_passages(served_generation(index) / "passages.jsonl"))
    pooled = {"cpu_s": 0.0, "wall_s": 0.0}
    plain = {"cpu_s": 0.0, "wall_s": 0.0}
    for at in range(0, len(passages), 64):
        batch = passages[at : at + 64]
        texts = [passage_embedding_text(p) for p in batch]
        for totals, work in (
            (pooled, lambda b=batch: embed_passages(b, embedder, batch_size=64)),
            (plain, lambda t=texts: embedder.encode(t, batch_size=64)),
        ):
            for key, value in _timed(work).items():
                totals[key] += value
    return {
        "passages": len(passages),
        "pooled": {k: round(v, 1) for k, v in pooled.items()},
        "encode_only": {k: round(v, 1) for k, v in plain.items()},
    }


def _doubt(index: Path, weights: Path, questions: Path, extra: list[str]) -> dict[str, Any]:
    """The share of questions whose first pass (the scorer with `weights`, hybrid top 5) is
    under the reader's doubt threshold."""
    from eval.calibrate.sentence_examples import examples_of
    from eval.lib.data import squad_part_of
    from eval.lib.questions import read_questions, sample
    from retrieval.retriever import Retriever
    from retrieval.sentences.reader import best_chance
    from retrieval.sentences.scorer import ScorerWeights, SentenceModel

    asked = read_questions(questions)
    if extra:  # the SQuAD arm: the part, then the seeded sample `answers` draws
        part = [
            q for q in asked if q.gold_passage_id and squad_part_of(q.gold_passage_id) == extra[1]
        ]
        asked = sample(part, int(extra[3]), int(extra[5]))
    scorer = ScorerWeights.read(weights)
    doubt = json.loads(weights.read_text())["reader"]["doubt"]
    embedder = SentenceTransformerEmbedder(EmbedderConfig())
    retriever = Retriever.open(index, embedder, scorer=scorer)
    examples = asyncio.run(examples_of(retriever, asked, 5))
    model = SentenceModel(scorer)
    chances = [best_chance(model.rank(e.found, e.features)) for e in examples]
    return {
        "questions": len(chances),
        "doubt": doubt,
        "read_share": round(float(np.mean([c < doubt for c in chances])), 4),
    }


def answered(
    index: Path,
    questions: Path,
    out: Path,
    url: str,
    extra: list[str],
    *,
    program: tuple[str, ...] = ("-m", "eval.commands.main"),
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """`answers` in quote mode over `index` (run as `python *program`), and what it measured."""
    command = [sys.executable, *program, "answers", "--questions"]
    command += [str(questions), "--index", str(index), "--answer-mode", "quote"]
    subprocess.run([*command, "--sglang-url", url, *extra, "--out", str(out)], check=True, env=env)
    metrics = json.loads(out.read_text())["metrics"]
    keys = ("answer_recall", "gold_in_sources", "citation_precision", "false_abstention_rate")
    keys += ("ttft_ms",)  # in-process, a quote's: the reader's reads and the span head's pass
    return {key: metrics[key] for key in keys} | {"by_form": metrics["by_form"]}


def _manual(work: Path) -> Path:
    questions = [json.loads(line) for line in QUESTIONS.read_text().splitlines()]
    gold = {Path(q["gold_passage_id"]).stem for q in questions if q["gold_passage_id"]}
    html = manual_pages(work / "cache")
    names = sorted(path.stem for path in html.glob("*.html"))
    folder = work / "manual" / PAGES_FOLDER
    shutil.rmtree(folder.parent, ignore_errors=True)
    folder.mkdir(parents=True)
    for n, name in enumerate(names):
        if name in gold or n % 20 == 0:
            shutil.copy(html / f"{name}.html", folder / f"{name}.html")
    return folder


def _squad(work: Path) -> Path:
    articles = set(json.loads(SPLIT.read_text())["parts"]["planner_training"])
    lines = (SQUAD_DIR / "passages.jsonl").read_text().splitlines()
    others = 0
    chosen = []
    for line in lines:
        article = json.loads(line)["_id"].rsplit("-", 1)[0]
        if article not in articles:
            others += 1
        if article in articles or others % 5 == 0:
            chosen.append(line)
    corpus = work / "squad.jsonl"
    corpus.write_text("\n".join(chosen) + "\n")
    return corpus


def development_sets(work: Path, squad_sample: int) -> dict[str, tuple[Any, Path, list[str]]]:
    """Each development set: its corpus as a source, its questions, and the `answers` options
    that pick them (the manual's 92 pages and 48 questions; SQuAD's planner-training sample)."""
    return {
        "manual": (
            open_source([_manual(work)], IngestOptions(source_url=SOURCE_URL)),
            QUESTIONS,
            [],
        ),
        "squad": (
            open_source([_squad(work)]),
            SQUAD_DIR / "questions.jsonl",
            ["--part", "planner_training", "--sample", str(squad_sample), "--seed", "1"],
        ),
    }


Arms = dict[str, tuple[dict[str, str], list[str]]]
"""An arm's name: what it adds to the environment and to `answers`' options."""


def answer_arms(
    work: Path, squad_sample: int, embedder: SentenceTransformerEmbedder, arms: Arms
) -> dict[str, Any]:
    """Each development set answered by each arm over the same index (built once in `work`),
    SGLang the repository's fake (a quote needs no model)."""
    results: dict[str, Any] = {}
    fake = create_fake_sglang(FakeSGLangState(model_path=str(_SMOLLM2)))
    with serve_in_thread(fake) as url:
        for name, (source, questions, extra) in development_sets(work, squad_sample).items():
            index = work / f"{name}-index"
            if not (index / "manifest.json").is_file():
                build_index(source, index, embedder, progress=False)
            entry: dict[str, Any] = {}
            for arm, (env, flags) in arms.items():
                slug = "-".join(arm.replace(",", " ").replace("(", " ").split()[:2])
                out = work / f"answers-{name}-{slug}.json"
                entry[arm] = answered(
                    index, questions, out, url, [*extra, *flags], env=os.environ | env
                )
            results[name] = entry
            print(name, json.dumps(entry, indent=1), flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--squad-sample", type=int, default=300)
    parser.add_argument("--tokenizer", default=str(_SMOLLM2))
    parser.add_argument("--before-weights", type=Path, help="the separate vectors' scorer")
    parser.add_argument(
        "--answers-only",
        action="store_true",
        help="answer again over the indexes an earlier run left in --work (after the scorer "
        "was fitted again, say)",
    )
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    embedder = SentenceTransformerEmbedder(EmbedderConfig())
    embedder.warm_up()
    sets = development_sets(args.work, args.squad_sample)
    results: dict[str, Any] = {}
    fake = create_fake_sglang(FakeSGLangState(model_path=args.tokenizer))
    with serve_in_thread(fake) as url:
        for name, (source, questions, extra) in sets.items():
            pooled, separate = args.work / f"{name}-pooled", args.work / f"{name}-separate"
            entry: dict[str, Any] = {}
            if not args.answers_only:
                started = time.perf_counter()
                report = build_index(source, pooled, embedder, force=True, progress=False)
                entry["passages"] = report.manifest.passage_count
                entry["build_wall_s"] = round(time.perf_counter() - started, 1)
                entry["separate_sentence_pass"] = _separate(pooled, separate, embedder)
                if name == "manual":
                    entry["passage_passes"] = _passes(pooled, embedder)
            for arm, index in (("pooled", pooled), ("separate", separate)):
                out = args.work / f"answers-{name}-{arm}.json"
                entry[arm] = answered(index, questions, out, url, extra)
            if args.before_weights:
                entry["reader_reads"] = {
                    "pooled, shipped scorer": _doubt(pooled, WEIGHTS, questions, extra),
                    "separate, --before-weights": _doubt(
                        separate, args.before_weights, questions, extra
                    ),
                }
            results[name] = entry
            print(name, json.dumps(entry, indent=1), flush=True)
    command = "python docs/benchmarks/sentence_pooling.py --work DIR "
    command += f"--squad-sample {args.squad_sample}"
    write_result(
        args.out,
        command + (" --answers-only" if args.answers_only else ""),
        args.squad_sample,
        results,
    )


def commit_now() -> str:
    return subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()


def write_result(out: Path, command: str, squad_sample: int, results: dict[str, Any]) -> None:
    """The result JSON with its command, commit, machine and load."""
    result = {
        "command": command,
        "commit": commit_now(),
        "machine": f"{os.cpu_count()} cores, shared with other sessions' work",
        "load_1min_at_end": os.getloadavg()[0],
        "squad_questions": f"planner_training, seeded sample of {squad_sample}",
        "results": results,
    }
    out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
