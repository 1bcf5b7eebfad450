"""Time to first token on SGLang on the CPU, with and without the prefix-attention patch
(`generation/server/sglang_compat/cpu_prefix_attention`), side by side in one run.

Two SmolLM2 servers run at once (idle ones sleep), one per variant; requests go to one at a time.
A ~1,500-token prompt (the service's system prompt, 5 consecutive SQuAD passages, a question)
is sent cold (after `/flush_cache`), again (fully cached), and with the same passages and a new
question. The variants are interleaved, their order alternating per repetition, so the noise of
a shared 2-core machine falls on both; the JSON has medians per case and variant, the ratio
patched/stock, and whether every variant and repetition gave the same greedy text.

    python -m eval.bench.prefix_attention --out docs/benchmarks/cpu-prefix-attention.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import httpx

from eval.lib.paths import SQUAD_DIR
from eval.lib.stack import free_port
from generation.prompt_layout import ContextPassage, HFChatTemplate, Prompt, build_prompt
from generation.server.env import SGLANG_VERSION
from generation.server.launch import SGLangServer, SGLangServerConfig, ensure_smollm2_model
from retrieval.corpus import Document, read_corpus

Variant = Literal["patched", "stock"]
Case = Literal["cold", "cached", "new_question"]
VARIANTS: tuple[Variant, ...] = ("patched", "stock")
CASES: tuple[Case, ...] = ("cold", "cached", "new_question")
PASSAGES_PER_PROMPT = 5
PASSAGES_SCANNED = 300


@dataclass(frozen=True, slots=True)
class Sample:
    variant: Variant
    case: Case
    repetition: int
    ttft_ms: float
    prompt_tokens: int
    cached_tokens: int
    text: str


@dataclass(frozen=True, slots=True)
class CaseResult:
    case: Case
    patched_ttft_ms: float
    stock_ttft_ms: float
    ratio: float  # patched / stock median TTFT
    cached_tokens: int
    prompt_tokens: int
    same_text: bool  # every repetition of both variants gave stock SGLang's text


@dataclass(frozen=True, slots=True)
class BenchPrompts:
    first: Prompt
    second: Prompt
    questions: tuple[str, str]


def choose_prompts(squad_dir: Path, template: HFChatTemplate, target_tokens: int) -> BenchPrompts:
    """The 5 consecutive passages (among the first few hundred) whose prompt is nearest
    target_tokens, and two questions whose gold passage is among them."""
    documents = list(itertools.islice(read_corpus(squad_dir / "passages.jsonl"), PASSAGES_SCANNED))
    with (squad_dir / "questions.jsonl").open() as lines:
        questions = [json.loads(line) for line in lines]
    best: tuple[int, list[Document], list[str]] | None = None
    for start in range(len(documents) - PASSAGES_PER_PROMPT + 1):
        window = documents[start : start + PASSAGES_PER_PROMPT]
        ids = {doc.doc_id for doc in window}
        asked = [q["question"] for q in questions if q["gold_passage_id"] in ids][:2]
        if len(asked) < 2:
            continue
        tokens = _prompt(asked[0], window, template).prompt_tokens
        if best is None or abs(tokens - target_tokens) < best[0]:
            best = (abs(tokens - target_tokens), window, asked)
    if best is None:
        raise SystemExit(f"no {PASSAGES_PER_PROMPT} passages with two questions in {squad_dir}")
    _, window, asked = best
    return BenchPrompts(
        _prompt(asked[0], window, template),
        _prompt(asked[1], window, template),
        (asked[0], asked[1]),
    )


def _prompt(question: str, documents: Sequence[Document], template: HFChatTemplate) -> Prompt:
    passages = [
        ContextPassage(n, doc.doc_id, doc.title, doc.text) for n, doc in enumerate(documents, 1)
    ]
    return build_prompt(question, passages, template, max_prompt_tokens=1 << 20)


def generate(
    client: httpx.Client, prompt: str, max_new_tokens: int
) -> tuple[float, dict[str, Any]]:
    """Stream one greedy `/generate`; (ms until the first chunk with output, the last chunk)."""
    body = {
        "text": prompt,
        "stream": True,
        "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0},
    }
    started = time.perf_counter()
    ttft_ms: float | None = None
    last: dict[str, Any] = {}
    with client.stream("POST", "/generate", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line.removeprefix("data: "))
            if "error" in chunk:
                raise RuntimeError(f"sglang stream error: {chunk['error']}")
            if ttft_ms is None and chunk.get("output_ids"):
                ttft_ms = (time.perf_counter() - started) * 1000.0
            last = chunk
    if ttft_ms is None:
        raise RuntimeError("sglang streamed no output")
    return ttft_ms, last


def run_cases(
    client: httpx.Client,
    variant: Variant,
    repetition: int,
    prompts: BenchPrompts,
    max_new_tokens: int,
) -> list[Sample]:
    # The last stream can end before the scheduler has retired its request; wait for idle.
    client.post("/flush_cache", params={"timeout": 30}).raise_for_status()
    sent: list[tuple[Case, str]] = [
        ("cold", prompts.first.text),
        ("cached", prompts.first.text),
        ("new_question", prompts.second.text),
    ]
    samples = []
    for case, text in sent:
        ttft_ms, last = generate(client, text, max_new_tokens)
        meta = last["meta_info"]
        samples.append(
            Sample(
                variant,
                case,
                repetition,
                round(ttft_ms, 1),
                int(meta["prompt_tokens"]),
                int(meta["cached_tokens"]),
                str(last["text"]),
            )
        )
    return samples


@contextmanager
def running_server(model_dir: Path, variant: Variant, log_dir: Path) -> Iterator[str]:
    server = SGLangServer(
        SGLangServerConfig(
            port=free_port(),
            model_dir=model_dir,
            device="cpu",
            max_total_tokens=8192,
            log_path=log_dir / f"sglang-{variant}.log",
            cpu_prefix_attention=variant == "patched",
        )
    )
    try:
        yield server.start()
    finally:
        server.stop()


def summarize(samples: Sequence[Sample], reference: dict[str, str]) -> list[CaseResult]:
    """Medians per case and variant; `reference` maps "first"/"second" to stock's answers."""
    results = []
    for case in CASES:
        of_case = [s for s in samples if s.case == case]
        median = {
            v: statistics.median(s.ttft_ms for s in of_case if s.variant == v) for v in VARIANTS
        }
        expected = reference["second" if case == "new_question" else "first"]
        results.append(
            CaseResult(
                case=case,
                patched_ttft_ms=round(median["patched"], 1),
                stock_ttft_ms=round(median["stock"], 1),
                ratio=round(median["patched"] / median["stock"], 3),
                cached_tokens=int(statistics.median(s.cached_tokens for s in of_case)),
                prompt_tokens=of_case[0].prompt_tokens,
                same_text=all(s.text == expected for s in of_case),
            )
        )
    return results


def _first_text(samples: Sequence[Sample], variant: Variant, case: Case) -> str:
    return next(s.text for s in samples if s.variant == variant and s.case == case)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repetitions", type=int, default=7)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--target-prompt-tokens", type=int, default=1500)
    parser.add_argument("--squad-dir", type=Path, default=SQUAD_DIR)
    parser.add_argument("--log-dir", type=Path, default=Path("/tmp/prefix-attention-bench"))
    args = parser.parse_args(argv)

    model_dir = ensure_smollm2_model(SGLangServerConfig().cache_dir)
    template = HFChatTemplate(str(model_dir))
    prompts = choose_prompts(args.squad_dir, template, args.target_prompt_tokens)
    args.log_dir.mkdir(parents=True, exist_ok=True)
    load_at_start = round(os.getloadavg()[0], 2)  # other work on the machine inflates TTFT
    started = time.perf_counter()
    samples: list[Sample] = []
    with ExitStack() as stack:
        clients: dict[Variant, httpx.Client] = {}
        for variant in VARIANTS:
            url = stack.enter_context(running_server(model_dir, variant, args.log_dir))
            clients[variant] = stack.enter_context(httpx.Client(base_url=url, timeout=300.0))
        for client in clients.values():  # warm-up, not recorded
            generate(client, prompts.first.text, args.max_new_tokens)
        for rep in range(args.repetitions):
            order = VARIANTS if rep % 2 == 0 else VARIANTS[::-1]
            for variant in order:
                samples += run_cases(clients[variant], variant, rep, prompts, args.max_new_tokens)
                print(
                    f"rep {rep} {variant}: "
                    + ", ".join(f"{s.case} {s.ttft_ms:.0f} ms" for s in samples[-len(CASES) :]),
                    flush=True,
                )
    # Stock SGLang's answers (its padded attention is the unpatched computation).
    reference = {
        "first": _first_text(samples, "stock", "cold"),
        "second": _first_text(samples, "stock", "new_question"),
    }
    results = summarize(samples, reference)
    report = {
        "benchmark": "cpu-prefix-attention",
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": "python -m eval.bench.prefix_attention --out " + str(args.out),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "load_avg_1m_at_start": load_at_start,
            "load_avg_1m_at_end": round(os.getloadavg()[0], 2),
        },
        "sglang": SGLANG_VERSION,
        "model": model_dir.name,
        "attention_backend": "torch_native",
        "prompt": {
            "prompt_tokens": prompts.first.prompt_tokens,
            "new_question_prompt_tokens": prompts.second.prompt_tokens,
            "passages": [p.source_id for p in prompts.first.passages],
            "questions": list(prompts.questions),
        },
        "repetitions": args.repetitions,
        "max_new_tokens": args.max_new_tokens,
        "variants": {
            "patched": "ANSWER_SGLANG_CPU_PREFIX_ATTENTION unset: new query rows only",
            "stock": "ANSWER_SGLANG_CPU_PREFIX_ATTENTION=0: SGLang's padded full attention",
        },
        "notes": (
            "cold runs the same attention in both variants (nothing cached: plain causal), so its "
            "ratio shows the machine's noise; cached and new_question are what the patch changes"
        ),
        "seconds": round(time.perf_counter() - started, 1),
        "results": [asdict(r) for r in results],
        "answers": {"first_question": reference["first"], "new_question": reference["second"]},
        "samples": [{k: v for k, v in asdict(sample).items() if k != "text"} for sample in samples],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    for r in results:
        print(
            f"{r.case:13} cached {r.cached_tokens:5d}/{r.prompt_tokens} "
            f"patched {r.patched_ttft_ms:7.1f} ms  stock {r.stock_ttft_ms:7.1f} ms  "
            f"ratio {r.ratio:.3f}  same text {r.same_text}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
