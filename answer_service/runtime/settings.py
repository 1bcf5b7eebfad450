"""The service's one settings class, read from the environment (prefix `ANSWER_`)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AliasChoices, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from answer_service.pipeline.admission import DEFAULT_QUEUE_MAX
from answer_service.pipeline.planning import read_quality_curves
from answer_service.runtime.keys.auth import read_api_keys
from budget.forms import AnswerMode
from retrieval.embedder import DEFAULT_EMBEDDER
from retrieval.rerank.base import DEFAULT_RERANKER
from retrieval.search.modes import registered_modes

DEFAULT_SGLANG_PORT = 30000
DEVICE_PATTERN = r"^(auto|cpu|cuda(:[0-9]+)?)$"
Device = Annotated[str, Field(pattern=DEVICE_PATTERN)]
PLACED_PARTS = ("embedder", "reranker", "index", "sglang")
# Each of the service's models' share of its GPU's memory unless `placement` says otherwise.
DEFAULT_GPU_SHARE = 0.05


@dataclass(frozen=True, slots=True)
class PartPlacement:
    """One part's entry of `placement`: its device and, on a GPU, its share of that GPU's
    memory (None: the part's default)."""

    device: str
    gpu_share: float | None = None


def parse_placement(text: str) -> dict[str, PartPlacement]:
    """`embedder=cuda:1@0.02,index=cpu` -> each part's entry; refuses what it cannot place."""
    parts: dict[str, PartPlacement] = {}
    for item in (item.strip() for item in text.split(",")):
        if not item:
            continue
        part, sep, where = item.partition("=")
        device, at, share = where.strip().partition("@")
        part, device = part.strip(), device.strip()
        if not sep or part not in PLACED_PARTS:
            raise ValueError(
                f"placement {item!r} is not PART=DEVICE[@SHARE], PART one of {PLACED_PARTS}"
            )
        if not re.match(DEVICE_PATTERN, device):
            raise ValueError(f"placement {item!r}: {device!r} is not auto, cpu, cuda or cuda:N")
        gpu_share = float(share) if at else None
        if gpu_share is not None and not 0.0 <= gpu_share < 1.0:
            raise ValueError(f"placement {item!r}: a GPU share is between 0 and 1")
        if part in parts:
            raise ValueError(f"placement names {part} twice")
        parts[part] = PartPlacement(device, gpu_share)
    return parts


# The files of `calibration_dir`, as the eval.calibrate commands name their results.
QUALITY_CURVES = "quality-curves.json"
FORM_CURVES = "form-curves.json"
SENTENCE_SCORER = "sentence-scorer.json"
SENTENCE_READER = "sentence-reader.npz"
SHORT_ANSWER = "short-answer.npz"
CALIBRATION_FILES = (QUALITY_CURVES, FORM_CURVES, SENTENCE_SCORER, SENTENCE_READER, SHORT_ANSWER)


# Settings that went, each with what took its place (docs/changelog.md). Set in the
# environment (where an unknown `ANSWER_` variable is otherwise ignored) or passed in, one is
# refused with its replacement rather than quietly left without effect.
REMOVED: dict[str, str] = {
    "embedder_device": "placement: embedder=DEVICE",
    "reranker_device": "placement: reranker=DEVICE",
    "index_device": "placement: index=DEVICE",
    "embedder_gpu_memory_fraction": "placement: embedder=DEVICE@SHARE",
    "reranker_gpu_memory_fraction": "placement: reranker=DEVICE@SHARE",
    "index_gpu_memory_fraction": "placement: index=DEVICE@SHARE",
    "sglang_device": "placement: sglang=DEVICE",
    "sglang_gpu": "placement: sglang=cuda:N",
    "sglang_mem_fraction_static": "placement: sglang=DEVICE@SHARE",
    "retrieval_workers": "fixed: 2 threads, as retrieval.Retriever.open sets",
    "rrf_k": "fixed: 60, retrieval.search.fusion.FusionConfig's",
    "dense_weight": "fixed: 1, retrieval.search.fusion.FusionConfig's",
    "lexical_weight": "fixed: 1, retrieval.search.fusion.FusionConfig's",
    "search_nprobe": "fixed: 16, answer_service.runtime.configs.SEARCH_DEPTH",
    "search_ef_search": "fixed: 64, answer_service.runtime.configs.SEARCH_DEPTH",
    "reranker_max_tokens": "fixed: 256, retrieval.rerank.base.RerankerConfig's",
    "prompt_layout": "fixed: cache_aware; eval: Experiment.prompt_layout",
    "prompt_cache_slack": "fixed: 0; eval: Experiment.prompt_cache_slack",
    "prompt_cache_adopt": "fixed: 0; eval: Experiment.prompt_cache_adopt",
    "prompt_example": "fixed: on; eval: Experiment.prompt_example",
    "frequency_penalty": "fixed: 0; eval: Experiment.frequency_penalty",
    "repetition_penalty": "fixed: 1; eval: Experiment.repetition_penalty",
    "copy_bias": 'fixed: {"passages": 4}; eval: Experiment.copy_bias',
    "planner_calibrate": "planner: calibrated (true), priors (false)",
    "planner_rerank_depths": "fixed: 0, 10, 20 and 30 (PlanningConfig's)",
    "planner_margin_fraction": "fixed: 0.1 (PlanningConfig's)",
    "planner_margin_ms": "fixed: 50 (PlanningConfig's)",
    "planner_admit_quantile": "fixed: 0.9 (PlanningConfig's)",
    "planner_burst_window_s": "fixed: 5 (PlanningConfig's)",
    "retrieval_floor_ms": "fixed: 250 (answer_service.runtime.configs.RETRIEVAL_FLOOR_MS)",
    "generation_slots_max": "fixed: 16 (answer_service.runtime.configs.MAX_GENERATION_SLOTS)",
    "sglang_routing": "fixed: prefix; eval: Experiment.sglang_routing",
    "form_quality": "fixed: curves; eval: Experiment.form_quality",
    "form_choice_file": "fixed; eval: Experiment.form_choice_file",
    "sentence_reader": "fixed: on; eval: Experiment.sentence_reader",
    "focused_neighbours": "fixed: 1; eval: Experiment.focused_neighbours",
    "citation_threshold": "fixed: 0.63 (attribution.SUPPORT_THRESHOLD)",
    "max_citation_sources": "fixed: 2 (CitationConfig's)",
    "gc_freeze": "fixed: always on",
    "loop_stall_ms": "fixed: off; eval: Experiment.loop_stall_ms",
    "recent_traces": "fixed: 500 (runtime/components.py)",
    "recent_requests": "fixed: 5000 (runtime/components.py)",
    "shared_requests": "fixed: 20000 (runtime/components.py)",
    "dashboard_interval_s": "fixed: 1 s (http/dashboard.py)",
    "local_cache_entries": "fixed: 2048 (runtime/components.py)",
    "embedding_cache_ttl_s": "fixed: a day (runtime/components.py)",
    "api_keys_reload_s": "fixed: 1 s (runtime/components.py)",
    "planner_quality_file": f"calibration_dir holding {QUALITY_CURVES}",
    "form_curves_file": f"calibration_dir holding {FORM_CURVES}",
    "sentence_scorer_file": f"calibration_dir holding {SENTENCE_SCORER}",
    "sentence_reader_file": f"calibration_dir holding {SENTENCE_READER}",
    "service_name": "OTEL_SERVICE_NAME (OpenTelemetry's own; default answer-service)",
    "rerank_candidates": "fixed: 20 with the planner off; eval: Experiment.fixed_rerank_depth",
    "temperature": "fixed: greedy, as every measurement and the answer cache assume",
    "tier_max_wait_ms": "fixed: 2000 (PlanningConfig.tier_max_wait_ms)",
    "sglang_connect_timeout_s": "fixed: 2 s (GenerationConfig's)",
    "snippet_chars": "fixed: 300 (PipelineConfig's)",
    "redis_timeout_s": "fixed: 0.25 s (RedisLink's)",
}


_BOOLEAN_WORDS = {"true": True, "1": True, "yes": True, "on": True}
_BOOLEAN_WORDS |= {"false": False, "0": False, "no": False, "off": False}


def refuse_removed(names: Iterable[str]) -> None:
    gone = sorted(set(names) & REMOVED.keys())
    if gone:
        reasons = "; ".join(f"{name} was removed ({REMOVED[name]})" for name in gone)
        raise ValueError(f"{reasons} (docs/changelog.md)")


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "answer-service"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ANSWER_", extra="forbid")

    cache_dir: Path = Field(default_factory=default_cache_dir)
    index_dir: Path | None = None
    # Seconds between checks of `index_dir` for a new generation (`index sync`, the document
    # API) or a flipped symlink, swapped in without dropping a request; 0: never
    # (answer_service/runtime/index_watch.py).
    index_watch_s: float = Field(default=2.0, ge=0.0)

    embedder_model: str = DEFAULT_EMBEDDER
    # Where the embedder, reranker and index run: auto (GPU 0 where torch sees one, else the
    # CPU), cpu, cuda (GPU 0) or cuda:N (answer_service/runtime/placement.py; the start-up log
    # says where each landed).
    device: Device = "auto"
    # Any part elsewhere, with its share of its GPU's memory: `part=device[@share]`, comma-
    # separated, parts `embedder`, `reranker`, `index` (default: `device`, 0.05 of a GPU each)
    # and `sglang`, for `answer-service sglang up` (auto: the GPUs nvidia-smi lists, else the
    # CPU; cuda:N: worker i on GPU N + i; the share: SGLang's --mem-fraction-static, default
    # SGLang's own less the service's models on the same GPU). E.g. `embedder=cuda:1@0.02,
    # index=cpu,sglang=cuda:1@0.6`.
    placement: Annotated[dict[str, PartPlacement], NoDecode] = Field(default_factory=dict)
    # A registered search mode (retrieval/search/modes.py): dense, lexical, or hybrid (the
    # reciprocal-rank fusion of dense and BM25 lists); an index without BM25 serves dense.
    retrieval_mode: str = "hybrid"
    # `builtin` (the packaged MiniLM with the shipped adapters: retrieval/rerank/builtin.py), or
    # a sentence-transformers CrossEncoder by hub id or folder; None turns the stage off.
    # Loaded in the background after warm-up; where it cannot load, the service says so once
    # and answers without it.
    reranker_model: str | None = DEFAULT_RERANKER

    sglang_url: str = f"http://127.0.0.1:{DEFAULT_SGLANG_PORT}"
    # Several SGLang workers the service routes over itself (JSON list or comma-separated),
    # instead of `sglang_url`: a prompt goes where its passages were sent before
    # (generation/prefix_routing.py).
    sglang_workers: Annotated[list[str], NoDecode] = Field(default_factory=list)
    # Tokenizer whose chat template lays the prompt out; default: the served model's path as
    # SGLang reports it (a local folder or a hub id).
    tokenizer: str | None = None
    max_prompt_tokens: int = Field(default=1800, ge=64)
    max_new_tokens: int = Field(default=160, ge=1, le=4096)

    default_ttft_budget_ms: int = Field(default=3000, gt=0)
    max_ttft_budget_ms: int = Field(default=120_000, gt=0)
    # The deadline planner (answer_service/pipeline/planning.py, docs/planner.md): per request,
    # the rerank depth and the passages in the prompt that fit the TTFT budget, and refusal (503
    # + Retry-After) when nothing fits; `calibrated` plans from each stage timed here at warm-up
    # (embed, search, sentences, each worker's first token; answer_service/runtime/calibration.py),
    # `priors` from the priors shipped in code; `off`: every request reranks 20 candidates and
    # gets `top_k` passages, as configured. true and false read as calibrated and off.
    planner: Literal["calibrated", "priors", "off"] = "calibrated"
    # A folder of calibration results measured for this deployment's models; each file there
    # replaces the one shipped (measured for SmolLM2-135M-Instruct and the default embedder):
    #   quality-curves.json   expected quality by rerank depth and passages, for the planner
    #                         (`python -m eval.calibrate.quality_curves`; shipped: the builtin
    #                         reranker's, measured on SQuAD, answer_service/pipeline/planning.py)
    #   form-curves.json      quality per answer form and context size, for `auto`
    #                         (`python -m eval.calibrate.form_curves`)
    #   sentence-scorer.json  the sentence scorer's weights and the quote's selection
    #                         (`python -m eval.calibrate.sentence_scorer`)
    #   sentence-reader.npz   the adapter of the cross-encoder over the embedder's MiniLM that
    #                         rereads the scorer's best few sentences where it is in doubt
    #                         (`python -m eval.calibrate.sentence_reader`)
    #   short-answer.npz      the span head that finds a quote's short answer, with its
    #                         threshold (`python -m retrieval.sentences.span_train`)
    calibration_dir: Path | None = None
    # Prompts each SGLang worker prefills at once; others wait by tenant tier. Unset: what
    # each worker was measured to batch at warm-up (1, 2, 4, ... prompts at once while a
    # doubling still pays, at most 16; answer_service/runtime/calibration.py), or 1 where the
    # warm-up does not calibrate.
    generation_slots_per_worker: int | None = Field(default=None, ge=1, le=64)
    # Requests that may wait for a worker's slots; more get 503 + Retry-After at once (the
    # planner's admission refuses earlier; with it off, this is the only bound).
    generation_queue_max: int = Field(default=DEFAULT_QUEUE_MAX, ge=0)
    # Tenant tiers (header `X-Tenant-Tier`) and their weighted shares of generation slots; a
    # request that has waited 2 s goes next whatever its tier (PlanningConfig.tier_max_wait_ms).
    tier_weights: dict[str, float] = Field(
        default_factory=lambda: {"premium": 3.0, "standard": 1.0}
    )
    default_tier: str = "standard"
    # A first token later than budget x factor is given up on; the budget itself is the target.
    ttft_timeout_factor: float = Field(default=4.0, ge=1.0)
    next_token_timeout_s: float = Field(default=20.0, gt=0.0)

    default_top_k: int = Field(default=5, ge=1)
    max_top_k: int = Field(default=20, ge=1)
    max_retrieve_k: int = Field(default=200, ge=1)
    max_query_chars: int = Field(default=2000, ge=1)

    # The answer form a request gets unless it asks (`answer_mode`; ANSWER_MODE): quote (the
    # sentences of the sources that answer, no model), focused (the model answers from those
    # sentences and their neighbours), passages (from whole passages), or auto (the planner
    # picks per request from the measured quality of each form and the time left).
    mode: AnswerMode = "auto"
    # A generated sentence no passage supports (answer_service/pipeline/attribution.py) is
    # `mark`ed (shown, its citation says supported: false), `drop`ped (each sentence is held
    # until checked) or `stop`s the answer.
    unsupported: Literal["mark", "drop", "stop"] = "mark"
    # Stop a generated answer that loops (a sentence or a long run of words repeated), aborting
    # the SGLang request; off only where a long repetitive answer is wanted (a load test).
    loop_guard: bool = True
    # A question whose sources are less likely than this to answer (the answerable model shipped
    # with the sentence scorer) gets "I do not know" without the model; default: the threshold
    # calibrated with it; 0: never.
    abstain_below: float | None = Field(default=None, ge=0.0, le=1.0)

    record_content: bool = False
    # API keys (answer_service/runtime/keys/auth.py): a JSON file of key digests with their tier and limits;
    # None: no keys asked for. `answer-service keys add` writes it.
    api_keys_file: Path | None = None
    # Request bodies over this get 413; browsers from these origins may call the API (CORS).
    max_body_bytes: int = Field(default=64 * 1024, ge=1024)
    cors_origins: Annotated[list[str], NoDecode] = Field(default_factory=list)

    # Redis, shared by the replicas (e.g. redis://127.0.0.1:6379/0); None: in-process only.
    # Keys start with `redis_prefix`. Every call is bounded by 0.25 s (RedisLink); when Redis
    # fails the service goes on with in-process fallbacks and `/readyz` says so.
    redis_url: str | None = None
    redis_prefix: str = Field(default="answer:", min_length=1)
    # With Redis the planner sees every replica's arrivals, per SGLang worker of the fleet:
    # how many workers that is (default: the ones this replica knows).
    fleet_workers: int | None = Field(default=None, ge=1)
    # Complete answers (greedy decoding only) are cached for this long, in Redis and, while it
    # is down, in a small in-process LRU; 0 turns the cache off.
    answer_cache_ttl_s: float = Field(default=600.0, ge=0.0)

    @field_validator("retrieval_mode")
    @classmethod
    def _known_mode(cls, value: str) -> str:
        if value not in registered_modes():
            raise ValueError(f"retrieval_mode {value!r} is not one of {registered_modes()}")
        return value

    @model_validator(mode="before")
    @classmethod
    def _none_removed(cls, data: object) -> object:
        environment = (k[7:].lower() for k in os.environ if k.upper().startswith("ANSWER_"))
        refuse_removed([*(data if isinstance(data, dict) else ()), *environment])
        return data

    @field_validator("placement", mode="before")
    @classmethod
    def _placement(cls, value: object) -> object:
        return parse_placement(value) if isinstance(value, str) else value

    def placed(self, part: str) -> PartPlacement:
        """Where `part` was asked to run, defaults filled in (sglang's share may stay None)."""
        asked = self.placement.get(part)
        if part == "sglang":
            return asked or PartPlacement("auto")
        device = asked.device if asked else self.device
        share = asked.gpu_share if asked and asked.gpu_share is not None else DEFAULT_GPU_SHARE
        return PartPlacement(device, share)

    @field_validator("planner", mode="before")
    @classmethod
    def _planner_on_or_off(cls, value: object) -> object:
        """`ANSWER_PLANNER=true`/`false`, as before the planner had three ways."""
        if isinstance(value, bool):
            return "calibrated" if value else "off"
        if isinstance(value, str) and value.strip().lower() in _BOOLEAN_WORDS:
            return "calibrated" if _BOOLEAN_WORDS[value.strip().lower()] else "off"
        return value

    @field_validator("calibration_dir")
    @classmethod
    def _calibration_files(cls, value: Path | None) -> Path | None:
        if value is None:
            return value
        if not any((value / name).is_file() for name in CALIBRATION_FILES):
            raise ValueError(f"calibration_dir {value} holds none of {CALIBRATION_FILES}")
        if (value / QUALITY_CURVES).is_file():
            read_quality_curves(value / QUALITY_CURVES)  # a bad file fails at start-up
        return value

    def calibrated(self, name: str) -> Path | None:
        """`calibration_dir`'s file `name` (one of CALIBRATION_FILES) where it holds one;
        None: the one shipped."""
        if self.calibration_dir is None or not (self.calibration_dir / name).is_file():
            return None
        return self.calibration_dir / name

    @field_validator("tier_weights")
    @classmethod
    def _positive_weights(cls, value: dict[str, float]) -> dict[str, float]:
        if not value or any(weight <= 0 for weight in value.values()):
            raise ValueError("tier_weights needs at least one tier, each with a weight > 0")
        return value

    @model_validator(mode="after")
    def _default_tier_known(self) -> Settings:
        if self.default_tier not in self.tier_weights:
            raise ValueError(
                f"default_tier {self.default_tier!r} is not in tier_weights {sorted(self.tier_weights)}"
            )
        return self

    @model_validator(mode="after")
    def _readable_keys(self) -> Settings:
        if self.api_keys_file is not None:  # a bad file fails at start-up, with its reason
            read_api_keys(self.api_keys_file, tiers=self.tier_weights)
        return self

    @field_validator("sglang_workers", "cors_origins", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        if isinstance(value, str):
            if value.strip().startswith("["):
                return json.loads(value)
            return [url.strip() for url in value.split(",") if url.strip()]
        return value

    @field_validator("sglang_workers")
    @classmethod
    def _distinct(cls, value: list[str]) -> list[str]:
        urls = [url.rstrip("/") for url in value]
        if len(set(urls)) != len(urls):
            raise ValueError("sglang_workers must be distinct")
        return urls

    @field_validator("reranker_model", "tokenizer", "redis_url", mode="before")
    @classmethod
    def _empty_means_none(cls, value: object) -> object:
        """`ANSWER_RERANKER_MODEL=` (or `none`) in the environment turns the option off."""
        if isinstance(value, str) and value.strip().lower() in ("", "none"):
            return None
        return value

    otel_exporter_otlp_endpoint: str | None = Field(
        default=None,
        validation_alias=AliasChoices(
            "ANSWER_OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"
        ),
    )
