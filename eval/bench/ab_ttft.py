"""Two running services side by side (the code before a change and after it, on one index and
one SGLang, the answer cache off): each question asked of both back to back, the first arm
alternating so SGLang's prefix cache favours neither; the client's time to the first token
(`eval/lib/load_engine.py`) per answer form, the ratio of medians and the paired difference.

    python -m eval.bench.ab_ttft --before URL --after URL --before-commit SHA \\
        --questions FILE --forms quote,passages --requests 200 --out F.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
from contextlib import aclosing
from itertools import cycle, islice
from pathlib import Path
from typing import Any

from eval.lib.latency_stats import percentiles
from eval.lib.load_engine import DedicatedClients, LoadConfig, RequestSlot, send_request
from eval.lib.questions import Question, read_load_questions
from eval.lib.results import write_result


async def compare(urls: dict[str, str], asked: list[Question], form: str) -> dict[str, Any]:
    configs = {
        arm: LoadConfig(url, 0.0, answer_mode=form, ttft_budget_ms=60_000)
        for arm, url in urls.items()
    }
    pairs: list[tuple[float, float]] = []
    async with aclosing(DedicatedClients(configs["before"])) as clients:
        for n, question in enumerate(asked):
            times = {}
            for arm in ("before", "after") if n % 2 == 0 else ("after", "before"):
                sent = await send_request(clients, configs[arm], RequestSlot(question, 0.0))
                times[arm] = sent.client_ttft_ms
            if times["before"] is not None and times["after"] is not None:
                pairs.append((times["before"], times["after"]))
    before, after = [p[0] for p in pairs], [p[1] for p in pairs]
    return {
        "pairs": len(pairs),
        "ttft_ms": {"before": percentiles(before), "after": percentiles(after)},
        "after_over_before": round(statistics.median(after) / statistics.median(before), 4),
        "paired_difference_ms": percentiles(b - a for a, b in pairs),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for arm in ("--before", "--after", "--before-commit"):
        parser.add_argument(arm, required=True)
    parser.add_argument("--questions", type=Path, required=True)
    parser.add_argument("--forms", default="quote,passages", help="answer modes, comma-separated")
    parser.add_argument("--requests", type=int, default=200, help="pairs per form")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    questions = read_load_questions(args.questions)
    urls, forms = {"before": args.before, "after": args.after}, args.forms.split(",")
    asyncio.run(compare(urls, questions[:4], forms[-1]))  # warm both: models load lazily
    asked = list(islice(cycle(questions), args.requests))
    metrics = {form: asyncio.run(compare(urls, asked, form)) for form in forms}
    config = {"forms": forms, "requests": args.requests, "before_commit": args.before_commit}
    dataset = {"questions_file": str(args.questions), "questions": len(questions)}
    write_result(args.out, "ab-ttft", config, dataset, metrics)
    print(json.dumps({form: m["after_over_before"] for form, m in metrics.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
