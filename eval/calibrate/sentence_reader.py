"""Learn the sentence reader (retrieval/sentences/reader.py) on SQuAD v1.1 train; measure it and
fit nothing else on the committed split of SQuAD dev.

    python -m eval.calibrate.sentence_reader examples --out var/reader/dev.jsonl.gz
    python -m eval.calibrate.sentence_reader examples --train 16000 --out var/reader/train.jsonl.gz
    python -m eval.calibrate.sentence_reader train --examples var/reader/train.jsonl.gz \\
        --dev var/reader/dev.jsonl.gz --questions 16000 --out-dir var/reader/q16k
    python -m eval.calibrate.sentence_reader ship --run var/reader/q16k

`examples` retrieves for each question as the service does (hybrid, top 5) and writes its
candidate sentences, labels (holds a gold answer string) and the shipped scorer's scores: for the
split's three parts, or with `--train N` SQuAD train's first N questions in a seeded order over
an index of all of it (resumable). `train` (torch only) learns the reader on the first
`--questions`, one epoch, each question's best answering candidate against its 3 hardest others
(the scorer's best without the answer), a softmax over the four; it resumes from its
checkpoint. SQuAD train shares no article with the split, so the reader's scores of the
scorer-training questions are those of a reader that never saw them: the scorer's command fits
the mix on them (read_mix.py). It reports how often the answering sentence comes first on each
part (the learning curve: on planner-training). `ship` copies a run into the package.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import logging
import math
import random
import shutil
import zlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from eval.calibrate.sentence_examples import examples_of, part_questions, retriever_for
from eval.lib.data import PARTS, SQUAD_DIR, SQUAD_TRAIN_DIR, shared
from eval.lib.questions import Question, read_questions
from eval.lib.results import measured_at
from retrieval.sentences.reader import ADAPTER_FILE, ReaderMeta, pair_text, write_adapter
from retrieval.sentences.scorer import ScorerWeights, SentenceModel

logger = logging.getLogger(__name__)

PACKAGE_ADAPTER = Path(__file__).resolve().parents[2] / "retrieval" / "sentences" / ADAPTER_FILE
REPORT = Path(__file__).resolve().parents[1] / "results" / "sentence-reader.json"
TRAIN_ORDER_SEED = 20261207


@dataclass(frozen=True, slots=True)
class Group:
    """One question and the candidates the reader reads (the scorer's best first)."""

    question_id: str
    part: str
    article: str
    question: str
    texts: tuple[str, ...]
    titles: tuple[str, ...]
    labels: npt.NDArray[np.float64]
    scores: npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class TrainConfig:
    rank: int = 16
    alpha: float = 32.0
    learning_rate: float = 5e-4
    # Hard negatives per question: the scorer's best candidates that do not hold the answer.
    negatives: int = 3
    # Layers below this one stay frozen (no backward pass through them).
    first_layer: int = 0
    with_title: bool = False
    batch_questions: int = 8
    max_tokens: int = 128
    seed: int = 0


def read_groups(path: Path, depth: int | None = 12, negatives: int | None = None) -> list[Group]:
    """Each record's quotable candidates in the scorer's order: its best `depth`, or with
    `negatives` its best answering one followed by its best `negatives` others (a record with
    neither is left out)."""
    groups = []
    for raw in _records(path):
        found = raw["candidates"]
        quotable = [i for i, c in enumerate(found) if c["quotable"]]
        quotable.sort(key=lambda i: -found[i]["score"])
        if negatives is None:
            kept = quotable[:depth]
        else:
            answering = [i for i in quotable if found[i]["label"] > 0][:1]
            others = [i for i in quotable if found[i]["label"] <= 0][:negatives]
            if not answering or not others:
                continue
            kept = answering + others
        groups.append(
            Group(
                raw["question_id"],
                raw["part"],
                raw["article"],
                raw["question"],
                tuple(found[i]["text"] for i in kept),
                tuple(found[i]["title"] for i in kept),
                np.asarray([found[i]["label"] for i in kept], dtype=np.float64),
                np.asarray([found[i]["score"] for i in kept], dtype=np.float64),
            )
        )
    return groups


def _records(path: Path) -> list[dict[str, Any]]:
    """The complete records of an example file (those before the cut where a run was killed)."""
    out = []
    try:
        with gzip.open(path, "rt", encoding="utf-8") as lines:
            for line in lines:
                if line.endswith("\n"):
                    out.append(json.loads(line))
    except (EOFError, gzip.BadGzipFile, zlib.error):
        logger.warning("examples file cut short path=%s kept=%d", path, len(out))
    return out


def train(groups: Sequence[Group], config: TrainConfig, base_dir: str, checkpoint: Path) -> Any:
    """The reader learned on `groups`, one epoch in a seeded order, resumably."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    from retrieval.sentences.reader_model import PairModel, add_adapters, train_steps

    torch.manual_seed(config.seed)
    order = list(groups)
    random.Random(config.seed).shuffle(order)
    encoder = AutoModel.from_pretrained(base_dir, dtype=torch.float32)
    add_adapters(encoder, config.rank, config.alpha, config.first_layer)
    model, tokenizer = PairModel(encoder), AutoTokenizer.from_pretrained(base_dir)
    size = config.batch_questions

    def loss_at(step: int) -> torch.Tensor:
        batch = order[step * size : (step + 1) * size]
        logits = _logits(model, tokenizer, batch, config)
        loss = torch.zeros(())
        start = 0
        for group in batch:
            n = len(group.texts)
            target = torch.tensor(group.labels / group.labels.sum(), dtype=torch.float32)
            loss = loss - (target * torch.log_softmax(logits[start : start + n], dim=0)).sum()
            start += n
        return loss / len(batch)

    steps = math.ceil(len(order) / size)
    losses, seconds = train_steps(
        model, loss_at, steps, learning_rate=config.learning_rate, checkpoint=checkpoint, clip=1.0
    )
    return model, tokenizer, losses, seconds


def _logits(model: Any, tokenizer: Any, batch: Sequence[Group], config: TrainConfig) -> Any:
    questions = [g.question for g in batch for _ in g.texts]
    seconds = [
        pair_text(text, title, config.with_title)
        for g in batch
        for text, title in zip(g.texts, g.titles, strict=True)
    ]
    encoded = tokenizer(
        questions,
        seconds,
        truncation="longest_first",
        max_length=config.max_tokens,
        padding=True,
        return_tensors="pt",
    )
    return model(**encoded)


Scores = dict[str, dict[str, float]]
"""Question id to the reader's score of each candidate, by the candidate's text (the scorer
command looks them up by text, so they survive a re-learned scorer's other order)."""


def score(model: Any, tokenizer: Any, groups: Sequence[Group], config: TrainConfig) -> Scores:
    import torch

    out: Scores = {}
    with torch.inference_mode():
        # A few questions a batch: each pads to its longest pair.
        for start in range(0, len(groups), 8):
            batch = [g for g in groups[start : start + 8] if g.texts]
            if not batch:
                continue
            values = _logits(model, tokenizer, batch, config).float().numpy().tolist()
            at = 0
            for g in batch:
                out[g.question_id] = dict(zip(g.texts, values[at : at + len(g.texts)], strict=True))
                at += len(g.texts)
    return out


def first_recall(
    groups: Sequence[Group], reader: Scores, weight: float | None, depth: int
) -> float:
    """How often the first sentence answers: the scorer's order (`weight` None), or its best
    `depth` reordered by score + weight x reader (`math.inf`: the reader alone)."""
    hits = 0
    for g in groups:
        if not g.texts:
            continue
        n = min(depth, len(g.texts))
        if weight is None:
            best = 0
        else:
            read = reader[g.question_id]
            r = np.asarray([read[text] for text in g.texts[:n]])
            combined = r if math.isinf(weight) else g.scores[:n] + weight * r
            best = int(np.argmax(combined))
        hits += bool(g.labels[best] > 0)
    return hits / len(groups) if groups else 0.0


def measure(groups: Sequence[Group], reader: Scores, most: int) -> dict[str, Any]:
    out: dict[str, Any] = {"questions": len(groups)}
    for depth in sorted({4, most} | {d for d in (8, 12) if d <= most}):
        row = {"scorer": round(first_recall(groups, reader, None, depth), 4)}
        row["reader"] = round(first_recall(groups, reader, math.inf, depth), 4)
        for w in (0.5, 1.0, 2.0, 4.0):
            row[f"scorer+{w}*reader"] = round(first_recall(groups, reader, w, depth), 4)
        out[f"depth_{depth}"] = row
    return out


def run_train(args: argparse.Namespace, config: TrainConfig) -> dict[str, Any]:
    args.out_dir.mkdir(parents=True, exist_ok=True)
    training = read_groups(args.examples, negatives=config.negatives)[: args.questions]
    checkpoint = args.out_dir / "checkpoint.pt"
    model, tokenizer, losses, trained_s = train(training, config, args.base, checkpoint)
    # Not the evaluation part: it is measured once, at the end, by the scorer's command.
    parts = ("scorer_training", "planner_training")
    dev = [g for g in read_groups(args.dev, depth=args.depth) if g.part in parts]
    scores = score(model, tokenizer, dev, config)
    meta = ReaderMeta(
        base=args.base_name,
        rank=config.rank,
        alpha=config.alpha,
        max_tokens=config.max_tokens,
        with_title=config.with_title,
    )
    write_adapter(args.out_dir / ADAPTER_FILE, meta, model.adapter_arrays())
    results: dict[str, Any] = {
        "config": asdict(config),
        "train_questions": len(training),
        "train_articles": len({g.article for g in training}),
        "train_seconds": round(trained_s, 1),
        "loss_first_50": round(float(np.mean(losses[:50])), 4),
        "loss_last_50": round(float(np.mean(losses[-50:])), 4),
    }
    for part in parts:
        results[part] = measure([g for g in dev if g.part == part], scores, args.depth)
    (args.out_dir / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    return results


def train_questions(count: int) -> list[Question]:
    """The first `count` questions of SQuAD train in a fixed seeded order."""
    questions = read_questions(shared(SQUAD_TRAIN_DIR / "questions.jsonl.gz"))
    random.Random(TRAIN_ORDER_SEED).shuffle(questions)
    return questions[:count]


async def write_examples(out: Path, top_k: int, train_count: int) -> int:
    """The example file `out`, for SQuAD train's first `train_count` questions (0: the split's
    parts), continuing one a killed run left: what it holds is kept, the rest appended."""
    if train_count:
        corpus = shared(SQUAD_TRAIN_DIR / "passages.jsonl.gz")
        parts = [("train", train_questions(train_count))]
    else:
        corpus = shared(SQUAD_DIR / "passages.jsonl")
        parts = [(part, part_questions(part)) for part in PARTS]
    done = await asyncio.to_thread(_restart, out)
    model = SentenceModel(ScorerWeights.read())
    retriever = await asyncio.to_thread(retriever_for, corpus)
    written = len(done)
    try:
        for part, questions in parts:
            todo = [q for q in questions if q.question_id not in done]
            for at in range(0, len(todo), 500):
                records = [
                    _record(example, part, model)
                    for example in await examples_of(retriever, todo[at : at + 500], top_k)
                ]
                # One gzip member per chunk: a run killed mid-chunk loses only that chunk.
                with gzip.open(out, "at", encoding="utf-8") as lines:
                    lines.writelines(json.dumps(r) + "\n" for r in records)
                written += len(records)
                logger.info("examples part=%s written=%d", part, written)
    finally:
        retriever.close()
    return written


def _restart(out: Path) -> set[str]:
    """`out` rewritten with its complete records only; their question ids."""
    kept = _records(out) if out.exists() else []
    out.parent.mkdir(parents=True, exist_ok=True)
    aside = out.with_suffix(".tmp")
    with gzip.open(aside, "wt", encoding="utf-8") as lines:
        lines.writelines(json.dumps(r) + "\n" for r in kept)
    aside.replace(out)
    return {r["question_id"] for r in kept}


def _record(example: Any, part: str, model: SentenceModel) -> dict[str, Any]:
    q = example.question
    scores = model.scores(example.features).tolist() if example.found else []
    return {
        "question_id": q.question_id,
        "part": part,
        "article": (q.gold_passage_id or "").rsplit("-", 1)[0],
        "question": q.question.strip(),
        "candidates": [
            {
                "text": c.text,
                "title": c.passage.title,
                "label": float(label),
                "score": float(s),
                "quotable": bool(c.ref.whole and c.ref.kind != "code"),
            }
            for c, label, s in zip(example.found, example.labels, scores, strict=True)
        ],
    }


def ship(run: Path) -> None:
    """A run's adapter into the package, its report into eval/results."""
    shutil.copyfile(run / ADAPTER_FILE, PACKAGE_ADAPTER)
    results = json.loads((run / "results.json").read_text())
    shipped = {"shipped": str(run), "commit": measured_at(), **results}
    REPORT.write_text(json.dumps(shipped, indent=1) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eval.calibrate.sentence_reader")
    commands = parser.add_subparsers(dest="command", required=True)
    examples = commands.add_parser("examples")
    examples.add_argument("--out", type=Path, required=True)
    examples.add_argument("--top-k", type=int, default=5)
    examples.add_argument("--train", type=int, default=0, help="SQuAD train's first N questions")
    training = commands.add_parser("train")
    training.add_argument("--examples", type=Path, required=True)
    training.add_argument("--dev", type=Path, required=True, help="the split's example file")
    training.add_argument("--questions", type=int, required=True)
    training.add_argument("--out-dir", type=Path, required=True)
    training.add_argument("--first-layer", type=int, default=0)
    training.add_argument(
        "--depth", type=int, default=4, help="the scorer's best N read on the split's parts"
    )
    training.add_argument("--threads", type=int, default=2)
    training.add_argument(
        "--base", default=None, help="the base encoder's folder (default: the packaged one)"
    )
    training.add_argument("--base-name", default=ReaderMeta().base)
    shipping = commands.add_parser("ship")
    shipping.add_argument("--run", type=Path, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    if args.command == "examples":
        print(asyncio.run(write_examples(args.out, args.top_k, args.train)), "questions written")
    elif args.command == "train":
        import torch

        from retrieval.embedder import resolve_model_path

        torch.set_num_threads(args.threads)
        args.base = args.base or resolve_model_path(args.base_name)
        results = run_train(args, TrainConfig(first_layer=args.first_layer))
        print(json.dumps(results, indent=1))
    else:
        ship(args.run)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
