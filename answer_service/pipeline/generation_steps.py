"""The generation part of an answer: wait for the worker's slot (by tier: the slot stage), lay
the prompt out with the generation re-plan (the prompt stage), send it (the send stage, up to
SGLang's response headers), and hand the open stream to the answer; each a stage run by the
`StageRunner`, each returning the next plan."""

from __future__ import annotations

from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field

from answer_service.errors import (
    InvalidRequestError,
    RoutedWorkerLostError,
    StageTimeoutError,
    UpstreamError,
    UpstreamUnavailableError,
)
from answer_service.pipeline.events import AnswerRequest
from answer_service.pipeline.planning import RequestPlanning
from answer_service.pipeline.prepared import Generation
from answer_service.pipeline.stage_runner import StageRunner
from answer_service.pipeline.stages import SlotRequest, SlotStage
from answer_service.pipeline.values import generate_attributes
from budget import CacheEstimator, Deadline
from budget.planner import PromptOption
from budget.request_plan import RequestPlan
from generation.client import GenerationClient, SamplingParams, StreamTimeouts
from generation.errors import (
    GenerationError,
    GenerationTimeoutError,
    PromptTooLongError,
    SGLangRequestError,
    SGLangUnavailableError,
    WorkerLostError,
)
from generation.prefix_routing import PrefixRouter
from generation.prompt_layout import ContextPassage, PassageLookup, Prompt
from generation.stages import PromptRequest, PromptStage, SendRequest, SendStage


@dataclass(frozen=True, slots=True)
class GenerationConfig:
    served_model: str
    max_new_tokens: int = 160
    temperature: float = 0.0
    next_token_timeout_s: float = 20.0
    sglang_connect_timeout_s: float = 2.0
    # Where an answer ends though the model goes on: it starts echoing the prompt's layout.
    stop: tuple[str, ...] = ("Question:", "<passage")
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    # Per form: raised logits for the prompt's passage tokens (`Prompt.vocabulary`).
    copy_bias: Mapping[str, float] = field(default_factory=dict)


class GenerationSteps:
    def __init__(
        self,
        runner: StageRunner,
        planning: RequestPlanning,
        workers: Mapping[str, GenerationClient],
        router: PrefixRouter,
        prompts: PromptStage,
        cache: CacheEstimator,
        config: GenerationConfig,
    ) -> None:
        self._runner = runner
        self._planning = planning
        self._senders = {url: SendStage(client) for url, client in workers.items()}
        self._slots = SlotStage(planning)
        self._router = router
        self._prompts = prompts
        self._cache = cache
        self._config = config

    async def open(
        self,
        request: AnswerRequest,
        question: str,
        plan: RequestPlan,
        deadline: Deadline,
        hard: Deadline,
        context: Sequence[ContextPassage],
        worker: str,
        lookup: PassageLookup,
        ready: Awaitable[None] | None = None,
    ) -> tuple[Generation, RequestPlan]:
        """The request's slot on `worker`, its prompt and its open stream, or an error.
        `question`: what the prompt asks (a follow-up as searched, `Queries.searched`);
        `ready`: the context's prompt pieces being made ahead (`PromptStage.prefetch`)."""
        gate = self._planning.gate
        slot_result, plan = await self._runner.run(
            self._slots,
            SlotRequest(worker, request.tier, plan.plan.uncached_tokens),
            hard,
            plan,
            worker=worker,
        )
        slot = slot_result.value
        plan = plan.queued(worker, slot.waited_ms)
        try:
            ahead = gate.prefilling_tokens(worker, slot)
            prompt, plan = await self._prompt(
                question, plan, deadline, context, worker, lookup, ahead, ready
            )
            uncached = self._uncached(worker, prompt)
            slot.owe(uncached)
            prefill_tokens = gate.prefilling_tokens(worker, slot) + uncached
            config = self._config
            send = SendRequest(
                prompt,
                SamplingParams(
                    config.max_new_tokens,
                    config.temperature,
                    stop=config.stop,
                    frequency_penalty=config.frequency_penalty,
                    repetition_penalty=config.repetition_penalty,
                    logit_bias=_copy_bias(prompt, config.copy_bias.get(plan.form, 0.0)),
                ),
                StreamTimeouts(hard, config.sglang_connect_timeout_s, config.next_token_timeout_s),
            )
            try:
                sent, plan, span = await self._runner.start(
                    self._senders[worker],
                    send,
                    deadline,
                    plan,
                    attributes={
                        **generate_attributes(
                            config.served_model, config.max_new_tokens, config.temperature
                        ),
                        "answer.prompt.expected_uncached_tokens": uncached,
                    },
                    worker=worker,
                )
            except GenerationError as exc:
                raise _service_error(exc) from exc
        except BaseException:
            slot.release()
            raise
        generation = Generation(
            prompt, sent.value, span, worker, slot, prefill_tokens, uncached_tokens=uncached
        )
        return generation, plan

    def _uncached(self, worker: str, prompt: Prompt) -> float:
        return self._cache.expected_uncached(
            worker, prompt.prompt_tokens, prompt.expected_cached_tokens
        )

    async def _prompt(
        self,
        question: str,
        plan: RequestPlan,
        deadline: Deadline,
        context: Sequence[ContextPassage],
        worker: str,
        lookup: PassageLookup,
        prefill_ahead_tokens: float,
        ready: Awaitable[None] | None,
    ) -> tuple[Prompt, RequestPlan]:
        """The prompt stage with the generation re-plan: the most of the planned passages whose
        predicted first token still fits the time left, given the real prompt, its cached
        prefix and the worker's queue. With the planner off, the planned passages as they are."""
        planner = self._planning.planner

        def fit(prompt: Prompt) -> tuple[bool, float]:
            option = PromptOption(
                len(prompt.passages), prompt.prompt_tokens, self._uncached(worker, prompt)
            )
            return planner.prompt_fits(
                deadline.remaining_ms(), option, prefill_ahead_tokens, worker
            )

        prompt_request = PromptRequest(
            question,
            context,
            plan.knobs.passages,
            self._router.tree(worker),
            lookup,
            fit if plan.planner else None,
            ready,
        )
        try:
            result, plan = await self._runner.run(self._prompts, prompt_request, deadline, plan)
        except GenerationError as exc:
            raise InvalidRequestError(str(exc)) from exc
        return result.value, plan


def _service_error(exc: GenerationError) -> Exception:
    """SGLang's refusals and failures before the stream began, as the service's errors."""
    if isinstance(exc, WorkerLostError):
        return RoutedWorkerLostError(str(exc), retry_after_s=1)
    if isinstance(exc, SGLangUnavailableError):
        return UpstreamUnavailableError(str(exc), retry_after_s=5)
    if isinstance(exc, PromptTooLongError):
        return InvalidRequestError(f"the prompt does not fit the model: {exc}")
    if isinstance(exc, SGLangRequestError):
        return UpstreamError(str(exc))
    if isinstance(exc, GenerationTimeoutError):  # not even the response's headers in time
        return StageTimeoutError(str(exc))
    return UpstreamError(str(exc))


def _copy_bias(prompt: Prompt, bias: float) -> tuple[tuple[int, float], ...]:
    """The prompt's passage tokens with `bias` each (none when it is 0)."""
    if not bias:
        return ()
    return tuple((token, bias) for token in sorted(prompt.vocabulary))
