"""`answer-service ask`: stream an answer and its sources to the terminal; `--interactive`
(or no question, at a terminal) asks one question after another as one conversation, each
sent with the turns before it (`history`), so a follow-up continues it."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Sequence

import httpx

from answer_service.cli.sse_client import iter_events


async def ask(
    url: str,
    question: str,
    budget_ms: int | None,
    top_k: int | None,
    api_key: str | None = None,
    answer_mode: str | None = None,
) -> int:
    status, _ = await _answer(url, question, budget_ms, top_k, api_key, answer_mode)
    return status


# The latest turns a conversation sends (the service takes at most 50 and 32 KiB).
_KEPT_TURNS = 20
_TURN_CHARS = 1500


async def converse(
    url: str,
    budget_ms: int | None,
    top_k: int | None,
    api_key: str | None = None,
    answer_mode: str | None = None,
) -> int:
    """Questions read one a line until an empty line or end of input; `/new` starts over."""
    history: list[dict[str, str]] = []
    print(
        "Ask a question; follow-ups continue the conversation. /new starts over; an empty line ends."
    )
    while True:
        try:
            question = (await asyncio.to_thread(input, "\n? ")).strip()
        except EOFError:
            return 0
        if not question:
            return 0
        if question == "/new":
            history.clear()
            continue
        status, answer = await _answer(
            url, question, budget_ms, top_k, api_key, answer_mode, history
        )
        if status != 0:
            continue
        history += [
            {"role": "user", "content": question},
            {"role": "assistant", "content": answer[:_TURN_CHARS]},
        ]
        del history[:-_KEPT_TURNS]


async def _answer(
    url: str,
    question: str,
    budget_ms: int | None,
    top_k: int | None,
    api_key: str | None = None,
    answer_mode: str | None = None,
    history: Sequence[dict[str, str]] = (),
) -> tuple[int, str]:
    """Streams one answer to the terminal: the exit status and the answer's text."""
    body: dict[str, object] = {"query": question}
    if history:
        body["history"] = list(history)
    if answer_mode is not None:
        body["answer_mode"] = answer_mode
    if budget_ms is not None:
        body["ttft_budget_ms"] = budget_ms
    if top_k is not None:
        body["top_k"] = top_k
    out = sys.stdout
    started_s = time.perf_counter()
    first_token_s: float | None = None
    parts: list[str] = []
    timeout = httpx.Timeout(10.0, read=120.0)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(timeout=timeout, headers=headers) as http:
        try:
            async with http.stream("POST", f"{url.rstrip('/')}/v1/answer", json=body) as response:
                if response.status_code != 200:
                    await response.aread()
                    print(f"error {response.status_code}: {response.text}", file=sys.stderr)
                    return 1, ""
                async for event in iter_events(response):
                    if event.event == "plan":
                        out.write(_plan_line(event.data))
                        searched = event.data.get("searched_query")
                        if searched and searched != question:
                            out.write(f"Searched: {searched}\n")
                    elif event.event == "sources":
                        out.write("Sources:\n")
                        for source in event.data["sources"]:
                            out.write(
                                f"  [{source['number']}] {source['title']}  "
                                f"({source['id']}, score {source['score']:.3f})\n"
                            )
                        out.write("\nAnswer: ")
                    elif event.event == "token":
                        first_token_s = first_token_s or time.perf_counter()
                        out.write(event.data["text"])
                        parts.append(event.data["text"])
                    elif event.event == "citation":
                        out.write("".join(f" [{n}]" for n in event.data["sources"]))
                    elif event.event == "error":
                        out.write(f"\n[error: {event.data['code']}: {event.data['message']}]")
                    elif event.event == "done":
                        _summary(event.data, started_s, first_token_s)
                    out.flush()
        except httpx.HTTPError as exc:
            print(f"error: cannot reach {url}: {exc}", file=sys.stderr)
            return 1, ""
    return 0, "".join(parts)


def _plan_line(plan: dict[str, object]) -> str:
    predicted = plan["predicted_ms"]
    total = sum(predicted.values()) if isinstance(predicted, dict) else 0.0
    cuts = plan["cuts"] if isinstance(plan["cuts"], list) else []
    cut_text = "; ".join(f"{c['stage']} {c['planned']}->{c['done']}: {c['reason']}" for c in cuts)
    return (
        f"Plan ({'planner' if plan['planner'] else 'fixed'}, tier {plan['tier']}): "
        f"answer form {plan.get('form', '?')} ({plan.get('form_reason', '')}); rerank "
        f"{plan['rerank_depth']}, {plan['passages']} passages, first token predicted in "
        f"{total:.0f} ms of {plan['budget_ms']:.0f}{'; cuts: ' + cut_text if cut_text else ''}\n"
    )


def _summary(done: dict[str, object], started_s: float, first_token_s: float | None) -> None:
    client_ttft = "-" if first_token_s is None else f"{(first_token_s - started_s) * 1000:.0f} ms"
    sys.stdout.write(
        f"\n\nTTFT {done['ttft_ms']} ms in the service (budget {done['ttft_budget_ms']} ms, "
        f"{client_ttft} at this client); stages {done['timings_ms']}; prompt "
        f"{done['prompt_tokens']} tokens ({done['cached_tokens']} cached), "
        f"{done['completion_tokens']} generated; trace {done['trace_id']}\n"
    )
