"""Learn the sentence reader (retrieval/sentences/reader.py) on SQuAD, on the committed split.

    python -m eval.calibrate.sentence_reader examples --out var/reader/examples.jsonl.gz
    python -m eval.calibrate.sentence_reader train --examples var/reader/examples.jsonl.gz \\
        --out-dir var/reader/run [--device auto] [--config NAME ...]
    python -m eval.calibrate.sentence_reader ship --run var/reader/run --config NAME

`examples` (needs the index: faiss, the embedder) retrieves for every question of the three
parts as `eval.calibrate.sentence_scorer` does (hybrid, top 5) and writes each question's
candidates with their labels (the sentence holds a gold answer string) and the shipped
scorer's score. `train` needs torch and transformers only, so it runs where a GPU is (a
minute there; hours on two CPU cores): for each configuration it learns the reader on the
scorer-training articles in three folds by article (each fold's questions scored by the model
that did not see their article: the scores the scorer's second stage is fitted on), then on
all of them (the model that ships, which scores the planner-training and evaluation
questions), and writes the adapters, the scores and how often the answering sentence comes
first. Configurations are compared on the folds only. `ship` copies one configuration's
adapter into the package and its scores beside the scorer's command (which reads them).

A question's candidates are the scorer's best `depth` quotable sentences: what the reader
reorders when it serves. It learns the softmax over them, as the scorer does: the answering
sentences share the target.
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
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from eval.calibrate.sentence_examples import examples_of, part_questions, retriever_for
from eval.lib.data import SQUAD_DIR, shared
from retrieval.sentences.reader import ADAPTER_FILE, ReaderMeta, pair_text, write_adapter
from retrieval.sentences.scorer import ScorerWeights, SentenceModel

logger = logging.getLogger(__name__)

PACKAGE_ADAPTER = Path(__file__).resolve().parents[2] / "retrieval" / "sentences" / ADAPTER_FILE
SCORES = Path(__file__).resolve().parents[1] / "results" / "sentence-reader-scores.json.gz"
REPORT = Path(__file__).resolve().parents[1] / "results" / "sentence-reader.json"
FOLDS = 3


@dataclass(frozen=True, slots=True)
class Group:
    """One question and the candidates the reader reorders (the scorer's best first)."""

    question_id: str
    part: str
    article: str
    question: str
    # Indices into the question's candidates, in the scorer's order.
    indices: tuple[int, ...]
    texts: tuple[str, ...]
    titles: tuple[str, ...]
    labels: npt.NDArray[np.float64]
    scores: npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class TrainConfig:
    name: str
    rank: int = 16
    alpha: float = 32.0
    learning_rate: float = 5e-4
    epochs: int = 4
    with_title: bool = False
    depth: int = 12
    batch_questions: int = 8
    max_tokens: int = 128
    seed: int = 0


CONFIGS = {
    c.name: c
    for c in (
        TrainConfig("r16"),
        TrainConfig("r16-title", with_title=True),
        TrainConfig("r32-long", rank=32, alpha=64.0, epochs=8),
        TrainConfig("r16-fast", learning_rate=1e-3),
    )
}


def read_groups(path: Path, depth: int) -> list[Group]:
    groups = []
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        for line in lines:
            raw = json.loads(line)
            found = raw["candidates"]
            quotable = [i for i, c in enumerate(found) if c["quotable"]]
            quotable.sort(key=lambda i: -found[i]["score"])
            kept = tuple(quotable[:depth])
            groups.append(
                Group(
                    raw["question_id"],
                    raw["part"],
                    raw["article"],
                    raw["question"],
                    kept,
                    tuple(found[i]["text"] for i in kept),
                    tuple(found[i]["title"] for i in kept),
                    np.asarray([found[i]["label"] for i in kept], dtype=np.float64),
                    np.asarray([found[i]["score"] for i in kept], dtype=np.float64),
                )
            )
    return groups


def _batches(groups: Sequence[Group], size: int, rng: random.Random) -> Iterator[list[Group]]:
    order = list(groups)
    rng.shuffle(order)
    for start in range(0, len(order), size):
        yield order[start : start + size]


def train(
    groups: Sequence[Group],
    config: TrainConfig,
    base_dir: str,
    device: str,
    initial: dict[str, npt.NDArray[Any]] | None = None,
) -> Any:
    """The reader learned on `groups` (those with an answering candidate), from the base or
    from the adapter `initial` (of `config`'s rank)."""
    import torch

    from retrieval.sentences.reader_model import PairModel

    torch.manual_seed(config.seed)
    rng = random.Random(config.seed)
    model, tokenizer = PairModel.from_base(base_dir, config.rank, config.alpha)
    if initial is not None:
        model.load_adapter(initial)
    model.to(device).train()
    usable = [g for g in groups if g.labels.any() and len(g.texts) > 1]
    steps = config.epochs * math.ceil(len(usable) / config.batch_questions)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=config.learning_rate, weight_decay=0.01)
    warmup = max(1, steps // 10)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: min((s + 1) / warmup, max(0.0, (steps - s) / max(1, steps - warmup))),
    )
    use_bf16 = device.startswith("cuda")
    step = 0
    for epoch in range(config.epochs):
        losses = []
        for batch in _batches(usable, config.batch_questions, rng):
            logits = _logits(model, tokenizer, batch, config, device, use_bf16)
            loss = torch.zeros((), device=device)
            start = 0
            for group in batch:
                n = len(group.texts)
                target = torch.tensor(group.labels / group.labels.sum(), device=device)
                log_p = torch.log_softmax(logits[start : start + n].float(), dim=0)
                loss = loss - (target.float() * log_p).sum()
                start += n
            loss = loss / len(batch)
            optimizer.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            torch.nn.utils.clip_grad_norm_(trainable, 1.0)
            optimizer.step()
            schedule.step()
            losses.append(float(loss))
            step += 1
        logger.info(
            "reader %s epoch=%d loss=%.4f steps=%d", config.name, epoch, np.mean(losses), step
        )
    return model.eval(), tokenizer


def _logits(
    model: Any,
    tokenizer: Any,
    batch: Sequence[Group],
    config: TrainConfig,
    device: str,
    use_bf16: bool,
) -> Any:
    import torch

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
    ).to(device)
    with torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=use_bf16):
        return model(**encoded)


Scores = dict[str, dict[str, float]]
"""Question id to the reader's score of each candidate, by the candidate's text (the scorer
command looks them up by text, so they survive a re-learned scorer's other order)."""


def score(
    model: Any, tokenizer: Any, groups: Sequence[Group], config: TrainConfig, device: str
) -> Scores:
    import torch

    out: Scores = {}
    with torch.inference_mode():
        for start in range(0, len(groups), 64):
            batch = [g for g in groups[start : start + 64] if g.texts]
            if not batch:
                continue
            logits = _logits(model, tokenizer, batch, config, device, device.startswith("cuda"))
            values = logits.float().cpu().numpy().tolist()
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


def measure(groups: Sequence[Group], reader: Scores, weights: Sequence[float]) -> dict[str, Any]:
    out: dict[str, Any] = {"questions": len(groups)}
    for depth in (4, 8, 12):
        row = {"scorer": round(first_recall(groups, reader, None, depth), 4)}
        row["reader"] = round(first_recall(groups, reader, math.inf, depth), 4)
        for w in weights:
            row[f"scorer+{w}*reader"] = round(first_recall(groups, reader, w, depth), 4)
        out[f"depth_{depth}"] = row
    return out


WEIGHTS_GRID = (0.25, 0.5, 1.0, 2.0, 4.0)


def run_train(args: argparse.Namespace) -> dict[str, Any]:
    from retrieval.embedder import pick_device

    device = pick_device(args.device)
    chosen = [CONFIGS[name] for name in (args.config or list(CONFIGS))]
    args.out_dir.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"device": device, "configs": {}}
    all_scores: dict[str, dict[str, Scores]] = {}
    for config in chosen:
        started = time.perf_counter()
        groups = read_groups(args.examples, config.depth)
        if args.limit:
            groups = groups[: args.limit]
        training = [g for g in groups if g.part == "scorer_training"]
        others = [g for g in groups if g.part != "scorer_training"]
        articles = sorted({g.article for g in training})
        out_of_fold: Scores = {}
        for fold in range(FOLDS):
            held = set(articles[fold::FOLDS])
            model, tokenizer = train(
                [g for g in training if g.article not in held], config, args.base, device
            )
            out_of_fold |= score(
                model, tokenizer, [g for g in training if g.article in held], config, device
            )
        model, tokenizer = train(training, config, args.base, device)
        shipped = score(model, tokenizer, others, config, device)
        meta = ReaderMeta(
            base=args.base_name,
            rank=config.rank,
            alpha=config.alpha,
            max_tokens=config.max_tokens,
            with_title=config.with_title,
        )
        write_adapter(args.out_dir / f"reader-{config.name}.npz", meta, model.adapter_arrays())
        all_scores[config.name] = {"out_of_fold": out_of_fold, "shipped": shipped}
        results["configs"][config.name] = {
            "config": asdict(config),
            "seconds": round(time.perf_counter() - started, 1),
            "scorer_training_out_of_fold": measure(training, out_of_fold, WEIGHTS_GRID),
            "planner_training": measure(
                [g for g in others if g.part == "planner_training"], shipped, WEIGHTS_GRID
            ),
            "evaluation": measure(
                [g for g in others if g.part == "evaluation"], shipped, WEIGHTS_GRID
            ),
        }
        logger.info("reader %s: %s", config.name, json.dumps(results["configs"][config.name]))
        (args.out_dir / "results.json").write_text(json.dumps(results, indent=1))
        with gzip.open(args.out_dir / "scores.json.gz", "wt", encoding="utf-8") as f:
            json.dump(all_scores, f)
    return results


async def write_examples(out: Path, top_k: int) -> int:
    model = SentenceModel(ScorerWeights.read())
    retriever = await asyncio.to_thread(retriever_for, shared(SQUAD_DIR / "passages.jsonl"))
    out.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    try:
        with gzip.open(out, "wt", encoding="utf-8") as lines:
            for part in ("scorer_training", "planner_training", "evaluation"):
                for example in await examples_of(retriever, part_questions(part), top_k):
                    q = example.question
                    scores = model.scores(example.features).tolist() if example.found else []
                    record = {
                        "question_id": q.question_id,
                        "part": part,
                        "article": (q.gold_passage_id or "").rsplit("-", 1)[0],
                        "question": q.question,
                        "candidates": [
                            {
                                "text": c.text,
                                "title": c.passage.title,
                                "label": float(label),
                                "score": float(s),
                                "quotable": bool(c.ref.whole and c.ref.kind != "code"),
                            }
                            for c, label, s in zip(
                                example.found, example.labels, scores, strict=True
                            )
                        ],
                    }
                    lines.write(json.dumps(record) + "\n")
                    written += 1
    finally:
        retriever.close()
    return written


def ship(run: Path, name: str) -> None:
    """The configuration `name` of a training run into the package (its adapter) and the
    results (its out-of-fold scores, which the scorer's command fits the mix on, and the run's
    report)."""
    shutil.copyfile(run / f"reader-{name}.npz", PACKAGE_ADAPTER)
    with gzip.open(run / "scores.json.gz", "rt", encoding="utf-8") as f:
        out_of_fold = json.load(f)[name]["out_of_fold"]
    results = json.loads((run / "results.json").read_text())
    rounded = {
        qid: {text: round(value, 4) for text, value in read.items()}
        for qid, read in out_of_fold.items()
    }
    with gzip.open(SCORES, "wt", encoding="utf-8") as f:
        json.dump({"config": results["configs"][name]["config"], "out_of_fold": rounded}, f)
    REPORT.write_text(json.dumps({"shipped": name, **results}, indent=1) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eval.calibrate.sentence_reader")
    commands = parser.add_subparsers(dest="command", required=True)
    examples = commands.add_parser("examples")
    examples.add_argument("--out", type=Path, required=True)
    examples.add_argument("--top-k", type=int, default=5)
    training = commands.add_parser("train")
    training.add_argument("--examples", type=Path, required=True)
    training.add_argument("--out-dir", type=Path, required=True)
    training.add_argument("--device", default="auto")
    training.add_argument(
        "--base", default=None, help="the base encoder's folder (default: the packaged one)"
    )
    training.add_argument("--base-name", default=ReaderMeta().base)
    training.add_argument("--config", action="append", choices=sorted(CONFIGS))
    training.add_argument("--limit", type=int, default=0, help="first N questions (a smoke run)")
    shipping = commands.add_parser("ship")
    shipping.add_argument("--run", type=Path, required=True)
    shipping.add_argument("--config", required=True, choices=sorted(CONFIGS))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    if args.command == "examples":
        print(asyncio.run(write_examples(args.out, args.top_k)), "questions written")
    elif args.command == "train":
        if args.base is None:
            from retrieval.embedder import resolve_model_path

            args.base = resolve_model_path(args.base_name)
        results = run_train(args)
        print(json.dumps(results, indent=1))
    else:
        ship(args.run, args.config)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
