"""Learn the span head (span.py) on SQuAD v1.1 train, on CPU, resumably.

    python -m retrieval.sentences.span_train --out-dir var/span/run --questions 20000 \\
        [--rank 16 --from-reader] [--ship]

Each question's example is the sentence of its paragraph (the project's splitter) that holds
its answer string, the span the string's first place in it; about one question in three also
gives a sentence of the same paragraph without the answer, whose target is [CLS] ("no answer
here"). Articles are kept apart: one in ten (by a hash of its title) is held out, the rest
give the `--questions` training questions. After training the head reads the held-out
questions' sentences (answering and not) and the threshold is the score above which a span's
SQuAD F1 is on average better than a half: it maximises the sum of (F1 - 0.5) over the spans
given (a span on a sentence without the answer counts F1 0). Checkpoints (every
`--checkpoint-every` steps) make a killed run resume where it stopped; the data order is fixed
by the seed. Writes `span.npz` and `report.json` in the run folder; `--ship` copies the head
into the package. SQuAD dev is never read.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import hashlib
import json
import logging
import random
import re
import shutil
import string
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from retrieval.embedder import DEFAULT_EMBEDDER, resolve_model_path
from retrieval.sentences.span import (
    SPAN_FILE,
    SpanMeta,
    best_span,
    char_span,
    read_span_file,
    token_span,
    whole_words,
    with_threshold,
    write_span_file,
)
from retrieval.sentences.splitter import split_sentences

logger = logging.getLogger(__name__)

SQUAD_TRAIN = Path("/work/shared/data/squad-v1.1-train")
PACKAGE_FILE = Path(__file__).resolve().parent / SPAN_FILE
HELD_OUT_EVERY = 10


@dataclass(frozen=True, slots=True)
class Example:
    question_id: str
    article: str
    question: str
    sentence: str
    # Characters of the answer in `sentence`; None: the sentence does not hold it.
    answer: tuple[int, int] | None
    gold: str


def held_out(article: str) -> bool:
    return int(hashlib.sha1(article.encode()).hexdigest(), 16) % HELD_OUT_EVERY == 0


def _jsonl(path: Path) -> Iterator[dict[str, Any]]:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            yield json.loads(line)


def squad_examples(folder: Path, seed: int, negative_rate: float) -> list[Example]:
    """Every question whose answer string lies inside one sentence, with its negatives."""
    texts = {row["_id"]: row["text"] for row in _jsonl(folder / "passages.jsonl.gz")}
    sentences: dict[str, list[str]] = {}
    rng = random.Random(seed)
    out: list[Example] = []
    for row in _jsonl(folder / "questions.jsonl.gz"):
        pid = row["gold_passage_id"]
        if pid not in sentences:
            text = texts[pid]
            sentences[pid] = [text[s.start : s.end] for s in split_sentences(text)]
        gold = row["answers"][0]
        holding = [s for s in sentences[pid] if gold in s]
        if not holding:
            continue
        article = pid.rsplit("-", 1)[0]
        at = holding[0].index(gold)
        question = row["question"].strip()
        qid = row["_id"]
        out.append(Example(qid, article, question, holding[0], (at, at + len(gold)), gold))
        others = [s for s in sentences[pid] if gold not in s]
        if others and rng.random() < negative_rate:
            out.append(Example(qid, article, question, rng.choice(others), None, gold))
    return out


def normalize_answer(text: str) -> str:
    """SQuAD's normalisation: lower case, no punctuation, articles or extra white space."""
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def f1(prediction: str, gold: str) -> float:
    pred, true = normalize_answer(prediction).split(), normalize_answer(gold).split()
    common = sum((collections.Counter(pred) & collections.Counter(true)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(true)
    return 2 * precision * recall / (precision + recall)


def encode(tokenizer: Any, batch: Sequence[Example], max_tokens: int) -> tuple[Any, Any, Any]:
    """The batch's tensors, each example's allowed positions ([CLS] and its sentence) and its
    target (first, last) token (0, 0 for [CLS]); examples whose answer was cut off point at
    [CLS] too."""
    import torch

    encoded = tokenizer(
        [e.question for e in batch],
        [e.sentence for e in batch],
        truncation="only_second",
        max_length=max_tokens,
        padding=True,
        return_offsets_mapping=True,
        return_tensors="pt",
    )
    offsets = encoded.pop("offset_mapping").tolist()
    allowed = torch.zeros(encoded["input_ids"].shape, dtype=torch.bool)
    targets = torch.zeros((len(batch), 2), dtype=torch.long)
    for row, example in enumerate(batch):
        in_sentence = [i == 1 for i in encoded.sequence_ids(row)]
        allowed[row] = torch.tensor(in_sentence)
        allowed[row, 0] = True
        if example.answer is not None:
            hit = token_span(offsets[row], in_sentence, *example.answer)
            if hit is not None:
                targets[row] = torch.tensor(hit)
    return encoded, allowed, targets


def predict(
    model: Any, tokenizer: Any, meta: SpanMeta, batch: Sequence[Example]
) -> list[tuple[str, float]]:
    """Each example's best span text and score (("", 0.0) where the sentence has no token)."""
    import torch

    encoded = tokenizer(
        [e.question for e in batch],
        [e.sentence for e in batch],
        truncation="only_second",
        max_length=meta.max_tokens,
        padding=True,
        return_offsets_mapping=True,
        return_tensors="pt",
    )
    offsets = encoded.pop("offset_mapping").tolist()
    with torch.inference_mode():
        starts, ends = model(**encoded)
    out: list[tuple[str, float]] = []
    for row, example in enumerate(batch):
        in_sentence = np.asarray([i == 1 for i in encoded.sequence_ids(row)], dtype=bool)
        picked = best_span(
            starts[row].double().numpy(),
            ends[row].double().numpy(),
            in_sentence,
            meta.max_answer_tokens,
        )
        if picked is None:
            out.append(("", 0.0))
            continue
        start, end = whole_words(example.sentence, *char_span(offsets[row], picked[0], picked[1]))
        out.append((example.sentence[start:end], picked[2]))
    return out


def batched(examples: list[Example], batch_size: int, rng: random.Random) -> list[Example]:
    """The examples shuffled, then grouped so that a batch's pairs are of about one length
    (less padding), the batches in a random order."""
    shuffled = list(examples)
    rng.shuffle(shuffled)
    chunk = batch_size * 50
    batches: list[list[Example]] = []
    for at in range(0, len(shuffled), chunk):
        part = sorted(shuffled[at : at + chunk], key=lambda e: len(e.question) + len(e.sentence))
        batches.extend(part[i : i + batch_size] for i in range(0, len(part), batch_size))
    rng.shuffle(batches)
    return [e for batch in batches for e in batch]


def choose_threshold(scores: Sequence[float], f1s: Sequence[float]) -> float:
    """The score above which the spans given maximise the sum of (F1 - 0.5)."""
    order = np.argsort(-np.asarray(scores))
    gains = np.cumsum(np.asarray(f1s)[order] - 0.5)
    best = int(np.argmax(gains))
    if gains[best] <= 0:
        return 1.0
    return float(np.asarray(scores)[order][best])


def train(args: argparse.Namespace) -> None:
    import torch

    from retrieval.sentences.reader_adapter import read_adapter
    from retrieval.sentences.reader_model import train_steps
    from retrieval.sentences.span_model import SpanModel

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    examples = squad_examples(args.data, args.seed, args.negative_rate)
    rng = random.Random(args.seed)
    train_ids = sorted({e.question_id for e in examples if not held_out(e.article)})
    test_ids = sorted({e.question_id for e in examples if held_out(e.article)})
    chosen = set(rng.sample(train_ids, min(args.questions, len(train_ids))))
    tested = set(rng.sample(test_ids, min(args.threshold_questions, len(test_ids))))
    train_set = [e for e in examples if e.question_id in chosen]
    test_set = [e for e in examples if e.question_id in tested]
    train_set = batched(train_set, args.batch_size, rng)
    meta = SpanMeta(DEFAULT_EMBEDDER, args.rank, args.alpha, args.max_tokens, 30, 0.5)
    model, tokenizer = SpanModel.from_base(
        resolve_model_path(meta.base), meta.rank, meta.alpha, args.first_layer
    )
    if args.from_reader:
        _, reader_arrays = read_adapter(None)
        model.encoder_load(reader_arrays)
    steps = max(1, len(train_set) * args.epochs // args.batch_size)

    def loss_at(step: int) -> torch.Tensor:
        at = (step * args.batch_size) % len(train_set)
        encoded, allowed, targets = encode(
            tokenizer, train_set[at : at + args.batch_size], meta.max_tokens
        )
        starts, ends = model(**encoded)
        return torch.nn.functional.cross_entropy(
            starts.masked_fill(~allowed, -1e4), targets[:, 0]
        ) + torch.nn.functional.cross_entropy(ends.masked_fill(~allowed, -1e4), targets[:, 1])

    losses, _ = train_steps(
        model,
        loss_at,
        steps,
        learning_rate=args.learning_rate,
        checkpoint=out_dir / "checkpoint.pt",
        warmup_share=0.05,
        checkpoint_every=args.checkpoint_every,
        log_every=args.log_every,
    )
    model.eval()
    scores, f1s, golds = [], [], []
    for at in range(0, len(test_set), 64):
        batch = test_set[at : at + 64]
        for example, (text, score) in zip(
            batch, predict(model, tokenizer, meta, batch), strict=True
        ):
            scores.append(score)
            f1s.append(f1(text, example.gold) if example.answer is not None else 0.0)
            golds.append(example.answer is not None)
    threshold = choose_threshold(scores, f1s)
    meta = with_threshold(meta, threshold)
    write_span_file(out_dir / SPAN_FILE, meta, model.arrays())
    report = _report(args, meta, steps, losses, scores, f1s, golds, len(train_set))
    (out_dir / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    logger.info("report %s", json.dumps(report["held_out"]))
    if args.ship:
        read_span_file(out_dir / SPAN_FILE)
        shutil.copyfile(out_dir / SPAN_FILE, PACKAGE_FILE)


def _report(
    args: argparse.Namespace,
    meta: SpanMeta,
    steps: int,
    losses: Sequence[float],
    scores: Sequence[float],
    f1s: Sequence[float],
    golds: Sequence[bool],
    train_examples: int,
) -> dict[str, Any]:
    s, f, g = np.asarray(scores), np.asarray(f1s), np.asarray(golds)
    given = s >= meta.threshold
    return {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "meta": asdict(meta),
        "steps": steps,
        "train_examples": train_examples,
        "loss_first_50": float(np.mean(losses[:50])),
        "loss_last_50": float(np.mean(losses[-50:])),
        "held_out": {
            "answering_sentences": int(g.sum()),
            "other_sentences": int((~g).sum()),
            "f1_best_span_answering": float(f[g].mean()) if g.any() else 0.0,
            "threshold": meta.threshold,
            "given_answering": float(given[g].mean()) if g.any() else 0.0,
            "given_other": float(given[~g].mean()) if (~g).any() else 0.0,
            "f1_of_given": float(f[given].mean()) if given.any() else 0.0,
        },
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--data", type=Path, default=SQUAD_TRAIN)
    parser.add_argument("--questions", type=int, default=20000)
    parser.add_argument("--threshold-questions", type=int, default=2000)
    parser.add_argument("--negative-rate", type=float, default=0.33)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--alpha", type=float, default=32.0)
    parser.add_argument("--from-reader", action="store_true")
    parser.add_argument("--first-layer", type=int, default=0)
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--learning-rate", type=float, default=5e-4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--log-every", type=int, default=20)
    parser.add_argument("--checkpoint-every", type=int, default=100)
    parser.add_argument("--ship", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    train(args)


if __name__ == "__main__":
    main()
