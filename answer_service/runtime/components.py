"""Building the service's components from settings, and warming them up.

`Components` is the composition root: one shared `httpx.AsyncClient`, the SGLang client, the
tracer and the recent-trace store exist from the start; the pipeline appears once warm-up
(embedder, index, chat template) has finished, and `not_ready_reasons()` says what is missing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from dataclasses import dataclass, field

import httpx
from opentelemetry.sdk.trace import TracerProvider

from answer_service.pipeline.answer_pipeline import AnswerPipeline, PipelineConfig
from answer_service.pipeline.probe import FloorProbe
from answer_service.runtime.caches import AnswerCache, EmbeddingCache, SharedCache, fingerprint
from answer_service.runtime.calibration import calibrate, calibrate_rerank
from answer_service.runtime.configs import (
    SHIPPED,
    Experiment,
    calibration_config,
    embedder_config,
    pipeline_config,
    reranker_config,
    scorer_weights,
)
from answer_service.runtime.conversations import ConversationStore
from answer_service.runtime.document_writer import DocumentWriter
from answer_service.runtime.fleet_rate import FleetArrivals
from answer_service.runtime.index_watch import IndexWatcher
from answer_service.runtime.keys.auth import KeyRing, StreamCounts, read_api_keys
from answer_service.runtime.keys.key_watch import KeyFileWatcher
from answer_service.runtime.keys.rate_limit import RateLimiter
from answer_service.runtime.observability.gc_pauses import GcPauses, freeze_heap, thaw_heap
from answer_service.runtime.observability.loop_lag import LoopLag
from answer_service.runtime.observability.metrics import ServiceMetrics
from answer_service.runtime.observability.request_log import RequestLog
from answer_service.runtime.observability.shared_requests import SharedRequests
from answer_service.runtime.observability.telemetry import RecentTraces, build_tracer_provider
from answer_service.runtime.placement import (
    Placement,
    PlacementError,
    apply_torch_memory_caps,
    cuda_gpu_count,
    gpu_total_bytes,
    plan_placement,
)
from answer_service.runtime.redis_link import RedisLink
from answer_service.runtime.settings import (
    SENTENCE_READER,
    SENTENCE_SCORER,
    SHORT_ANSWER,
    Settings,
)
from generation.errors import GenerationError
from generation.prompt_layout import HFChatTemplate
from generation.sglang_client import SGLangClient
from retrieval.embedder import Embedder, SentenceTransformerEmbedder
from retrieval.errors import RetrievalError
from retrieval.rerank.factory import load_reranker
from retrieval.retriever import Retriever
from retrieval.sentences.reader import ReaderConfig, ReadMix, SentenceReader
from retrieval.sentences.span import SpanConfig, SpanReader

logger = logging.getLogger(__name__)

_SGLANG_RETRY_S = 2.0
# In-memory bounds, far from reached in a 30-minute soak at goodput (docs/operations.md#soak):
# finished traces for GET /traces, request summaries for the dashboard, and with Redis every
# replica's summaries (XADD's cap); entries of the in-process LRU that stands in for Redis.
RECENT_TRACES = 500
RECENT_REQUESTS = 5000
SHARED_REQUESTS = 20_000
LOCAL_CACHE_ENTRIES = 2048
# A query's embedding depends only on the embedder, which is part of the cache key.
EMBEDDING_CACHE_TTL_S = 86_400.0
# How often the key file is checked for a change: revoked or added keys take effect within a
# second, without a restart (a broken file keeps the old keys).
API_KEYS_RELOAD_S = 1.0


@dataclass(slots=True)
class Components:
    settings: Settings
    http: httpx.AsyncClient
    # The SGLang endpoints requests go to: one server or router, or the workers the service
    # routes over itself (ANSWER_SGLANG_WORKERS). `sglang` is the first.
    workers: list[SGLangClient]
    recent: RecentTraces
    provider: TracerProvider
    metrics: ServiceMetrics
    request_log: RequestLog
    gc_pauses: GcPauses
    loop_lag: LoopLag
    redis: RedisLink | None = None
    shared_requests: SharedRequests | None = None
    # Every replica's arrival rate, for the planner (with Redis).
    fleet: FleetArrivals | None = None
    # API keys (None: none asked for), their rate limits and open answers.
    keys: KeyRing | None = None
    # What an eval command varies in-process; the service runs the shipped one.
    experiment: Experiment = SHIPPED
    rate_limiter: RateLimiter = field(default_factory=lambda: RateLimiter(None))
    # The Responses API's conversations (`previous_response_id`), per key, with a TTL.
    conversations: ConversationStore = field(default_factory=lambda: ConversationStore(None))
    streams: StreamCounts = field(default_factory=StreamCounts)
    retriever: Retriever | None = None
    pipeline: AnswerPipeline | None = None
    served_model: str | None = None
    warm_up_error: str | None = None
    # The idle floor from the stage timings measured at warm-up (None: not calibrated).
    calibrated_floor_ms: float | None = None
    # The stage models measured at warm-up (the rest keep the shipped priors).
    calibrated_stages: list[str] = field(default_factory=list)
    reranker_status: str = "not loaded"
    # Documents put and deleted over HTTP, and the watcher that swaps in what they publish
    # (both set in warm-up).
    documents: DocumentWriter | None = None
    index_watcher: IndexWatcher | None = None
    # The sentence reader and its mix, loaded once with the first index (None: not used).
    reader: tuple[SentenceReader, ReadMix] | None = None
    _reader_loaded: bool = field(default=False)
    # The span head that finds a quote's short answer, loaded once too (None: not used).
    span_reader: SpanReader | None = None
    _span_loaded: bool = field(default=False)
    # Where the embedder, reranker and index run, and their GPU shares (set in warm-up).
    placement: Placement | None = None
    _warm_up_task: asyncio.Task[None] | None = field(default=None)
    _reranker_task: asyncio.Task[None] | None = field(default=None)
    _watch_task: asyncio.Task[None] | None = field(default=None)
    _fleet_task: asyncio.Task[None] | None = field(default=None)
    _lag_task: asyncio.Task[None] | None = field(default=None)
    _keys_task: asyncio.Task[None] | None = field(default=None)

    @classmethod
    def create(cls, settings: Settings, experiment: Experiment = SHIPPED) -> Components:
        http = httpx.AsyncClient(
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
            timeout=httpx.Timeout(10.0),
        )
        recent = RecentTraces(RECENT_TRACES)
        provider = build_tracer_provider(recent, settings.otel_exporter_otlp_endpoint)
        urls = settings.sglang_workers or [settings.sglang_url]
        workers = [SGLangClient(http, url) for url in urls]
        redis = shared = None
        if settings.redis_url is not None:
            redis = RedisLink.from_url(settings.redis_url, prefix=settings.redis_prefix)
            shared = SharedRequests(redis, maxlen=SHARED_REQUESTS)
        request_log = RequestLog(RECENT_REQUESTS, sink=shared)
        keys = None
        if settings.api_keys_file is not None:
            keys = KeyRing(read_api_keys(settings.api_keys_file, tiers=settings.tier_weights))
        metrics = ServiceMetrics(listeners=(request_log,))
        return cls(
            settings,
            http,
            workers,
            recent,
            provider,
            metrics,
            request_log,
            GcPauses(metrics.registry),
            LoopLag(metrics.registry, stall_s=experiment.loop_stall_ms / 1000.0),
            redis=redis,
            shared_requests=shared,
            fleet=FleetArrivals(redis) if redis is not None else None,
            keys=keys,
            rate_limiter=RateLimiter(redis),
            conversations=ConversationStore(redis),
            experiment=experiment,
        )

    async def redis_status(self) -> str:
        """`not configured`, `up`, or `down: <error>` (a fresh ping)."""
        if self.redis is None:
            return "not configured"
        return "up" if await self.redis.ping() else f"down: {self.redis.error}"

    @property
    def sglang(self) -> SGLangClient:
        return self.workers[0]

    def start_warm_up(self) -> None:
        self.gc_pauses.install()
        loop = asyncio.get_running_loop()
        self._warm_up_task = loop.create_task(self._warm_up())
        self._lag_task = loop.create_task(self.loop_lag.run())
        if self.fleet is not None:
            self._fleet_task = loop.create_task(self.fleet.run())
        settings = self.settings
        if self.keys is not None and settings.api_keys_file:
            watcher = KeyFileWatcher(
                self.keys, settings.api_keys_file, settings.tier_weights, every_s=API_KEYS_RELOAD_S
            )
            self._keys_task = loop.create_task(watcher.run())

    async def wait_ready(self, *, reranker: bool = False) -> None:
        """Until warm-up has ended; with `reranker`, until the reranker has loaded (or failed)
        too: a measurement of the configured service, not of its first seconds without it."""
        if self._warm_up_task is not None:
            await self._warm_up_task
        if reranker and self._reranker_task is not None:
            await self._reranker_task

    async def _warm_up(self) -> None:
        """Build the pipeline; a failure is kept for /readyz (with its type where it is not
        one of ours: out of memory, a faiss or tokenizer error) and logged, never lost."""
        try:
            await self._build_pipeline()
        except (RetrievalError, GenerationError, PlacementError) as exc:
            self.warm_up_error = str(exc)
            logger.error("warm-up failed error=%s", exc)
        except Exception as exc:
            self.warm_up_error = f"{type(exc).__name__}: {exc}"
            logger.exception("warm-up failed error=%s", self.warm_up_error)

    async def _build_pipeline(self) -> None:
        settings = self.settings
        if settings.index_dir is None:
            raise RetrievalError("no index configured (ANSWER_INDEX_DIR or --index)")
        placement = await asyncio.to_thread(self.place_models)
        embedder = SentenceTransformerEmbedder(
            embedder_config(settings, device=placement.embedder.device)
        )
        self.retriever = await asyncio.to_thread(self.open_retriever, embedder)
        tokenizer = settings.tokenizer or await self._served_model()
        self.served_model = self.served_model or tokenizer
        template = HFChatTemplate(tokenizer)
        await asyncio.to_thread(template.warm_up)
        # Before it is ready: a full collection walks the ~550k objects torch and the models
        # left, stalling every answer (answer_service/runtime/observability/gc_pauses.py).
        await asyncio.to_thread(freeze_heap, collect=True)
        config = pipeline_config(settings, self.served_model, self.experiment)
        pipeline = AnswerPipeline(
            self.retriever,
            template,
            self.workers,
            self.provider.get_tracer("answer_service"),
            config,
            self.metrics,
            answer_cache=self._answer_cache(config, self.retriever),
            embeddings=self._embedding_cache(self.retriever),
            fleet=self.fleet,
        )
        await asyncio.to_thread(pipeline.prompts.warm_up)
        calibration = calibration_config(settings)
        if calibration.enabled:  # before any request is let in
            calibrated = await calibrate(
                pipeline.planning, self.retriever, self.workers, calibration, pipeline.prompts
            )
            self.calibrated_floor_ms = round(calibrated.floor_ms, 1)
            self.calibrated_stages = list(calibrated.stages)
            workers = {w.base_url: w for w in self.workers}
            pipeline.floor_probe = FloorProbe(pipeline.planning, workers)
        self.pipeline = pipeline
        logger.info(
            "warm-up finished passages=%d model=%s index_device=%s index_backend=%s",
            len(self.retriever.index),
            self.served_model,
            self.retriever.index.dense.device,
            self.retriever.index.dense.search_backend,
        )
        self._reranker_task = asyncio.get_running_loop().create_task(self._load_reranker())
        grace_s = settings.max_ttft_budget_ms / 1000.0 * settings.ttft_timeout_factor
        watcher = IndexWatcher(
            self, settings.index_dir, every_s=settings.index_watch_s, grace_s=grace_s
        )
        await watcher.remember()
        self.index_watcher = watcher
        self.documents = DocumentWriter(settings.index_dir, self.retriever.embedder)
        if settings.index_watch_s > 0:
            self._watch_task = asyncio.get_running_loop().create_task(watcher.run())

    def place_models(self) -> Placement:
        """Where the embedder, reranker and index run, decided once; caps this process's torch
        memory on each GPU at their shares (blocking: asks torch for its GPUs)."""
        if self.placement is None:
            self.placement = plan_placement(self.settings, cuda_gpu_count())
            caps = apply_torch_memory_caps(self.placement)
            logger.info(
                "placement %s torch_memory_caps=%s",
                self.placement.describe(),
                ",".join(f"cuda:{gpu}@{cap:g}" for gpu, cap in caps.items()) or "none",
            )
        return self.placement

    def open_retriever(self, embedder: Embedder) -> Retriever:
        """The configured index directory's retriever (blocking: run it in a thread)."""
        settings = self.settings
        assert settings.index_dir is not None
        index = self.place_models().index
        share_bytes = (
            int(index.gpu_memory_fraction * gpu_total_bytes(index.gpu))
            if index.gpu is not None
            else None
        )
        return Retriever.open(
            settings.index_dir,
            embedder,
            device=index.device,
            index_max_gpu_bytes=share_bytes,
            scorer=scorer_weights(settings),
            reader=self._sentence_reader(),
            short=self._span_reader(),
        )

    def _sentence_reader(self) -> tuple[SentenceReader, ReadMix] | None:
        """The sentence reader, warmed up, with the mix learned with the scorer's weights;
        None (said once, with the reason) where it is off or cannot be had: the scorer's order
        serves. Loaded once; a swapped-in index keeps it. Blocking."""
        if self._reader_loaded:
            return self.reader
        self._reader_loaded = True
        settings = self.settings
        if not self.experiment.sentence_reader:
            logger.info("sentence reader disabled by configuration")
            return None
        try:
            mix = ReadMix.read(settings.calibrated(SENTENCE_SCORER))
            if mix is None:
                logger.warning("sentence reader unused: the scorer was learned without one")
                return None
            reader = SentenceReader(
                ReaderConfig(
                    adapter=settings.calibrated(SENTENCE_READER),
                    device=self.place_models().embedder.device,
                    cache_dir=settings.cache_dir,
                ),
                settings.embedder_model,
            )
            reader.warm_up()
        except RetrievalError as exc:
            logger.warning("sentence reader unavailable, quoting in the scorer's order: %s", exc)
            return None
        self.reader = (reader, mix)
        return self.reader

    def _span_reader(self) -> SpanReader | None:
        """The span head, warmed up; None (said once, with the reason) where it is off or
        cannot be had: quotes go without a short answer. Loaded once. Blocking."""
        if self._span_loaded:
            return self.span_reader
        self._span_loaded = True
        if not self.experiment.short_answer:
            logger.info("short answers disabled by configuration")
            return None
        settings = self.settings
        reader = SpanReader(
            SpanConfig(
                settings.calibrated(SHORT_ANSWER),
                self.place_models().embedder.device,
                cache_dir=settings.cache_dir,
            ),
            settings.embedder_model,
        )
        try:
            reader.warm_up()
        except RetrievalError as exc:
            logger.warning("span head unavailable, quotes without short answers: %s", exc)
            return None
        self.span_reader = reader
        return reader

    def swap_retriever(self, retriever: Retriever) -> Retriever | None:
        """Serve from `retriever` from now on (the reranker carries over); returns the old
        one, which requests under way may still be using."""
        old = self.retriever
        if old is not None and old.reranker is not None:
            retriever = retriever.with_reranker(old.reranker)
        self._serve(retriever)
        return old

    def _serve(self, retriever: Retriever) -> None:
        self.retriever = retriever
        if self.pipeline is not None:
            config = pipeline_config(self.settings, self.served_model, self.experiment)
            self.pipeline.swap_retriever(retriever, self._answer_cache(config, retriever))

    def _store(self, namespace: str, ttl_s: float) -> SharedCache:
        return SharedCache(self.redis, namespace, ttl_s=ttl_s, capacity=LOCAL_CACHE_ENTRIES)

    def _answer_cache(self, config: PipelineConfig, retriever: Retriever) -> AnswerCache | None:
        ttl_s = self.settings.answer_cache_ttl_s
        if ttl_s <= 0:
            return None
        manifest = retriever.index.manifest
        shape = dataclasses.asdict(config)
        shape.pop("planning")  # how much work a request gets, not what its answer says
        parts = {"index": manifest.to_json(), "pipeline": shape, "version": 1}
        return AnswerCache(self._store("answer", ttl_s), fingerprint(parts))

    def _embedding_cache(self, retriever: Retriever) -> EmbeddingCache:
        return EmbeddingCache(
            self._store("embedding", EMBEDDING_CACHE_TTL_S), retriever.embedder.name
        )

    async def _load_reranker(self) -> None:
        """Attach the reranker when it has loaded; until then requests go without it."""
        settings = self.settings
        if settings.reranker_model is None:
            self.reranker_status = "disabled by configuration"
            return
        self.reranker_status = f"loading {settings.reranker_model}"
        config = reranker_config(settings, device=self.place_models().reranker.device)
        try:
            reranker = await asyncio.to_thread(load_reranker, config)
        except Exception as exc:  # not a load failure it knows (those say None): say which
            self.reranker_status = f"failed: {type(exc).__name__}: {exc}"
            logger.exception(
                "reranker failed, answering without the rerank stage model=%s",
                settings.reranker_model,
            )
            return
        if reranker is None:
            self.reranker_status = f"unavailable: {settings.reranker_model} could not be loaded"
        elif self.retriever is not None:
            reranking = self.retriever.with_reranker(reranker)
            calibration = calibration_config(settings)
            # Timed here before any request is sent to it, as the other stages were.
            if (
                calibration.enabled
                and self.pipeline is not None
                and await calibrate_rerank(self.pipeline.planning, reranking, calibration)
            ):
                self.calibrated_stages = sorted({*self.calibrated_stages, "rerank"})
            self._serve(reranking)
            self.reranker_status = reranker.name

    async def _served_model(self) -> str:
        """The model SGLang serves; waits for SGLang to come up (readiness says so meanwhile)."""
        while True:
            try:
                self.served_model = await self.sglang.model_path()
                return self.served_model
            except GenerationError as exc:
                logger.info("waiting for sglang url=%s error=%s", self.sglang.base_url, exc)
                await asyncio.sleep(_SGLANG_RETRY_S)

    def generation_slots(self) -> dict[str, int]:
        """Each worker's generation slots (empty until the pipeline is built)."""
        if self.pipeline is None:
            return {}
        gate = self.pipeline.planning.gate
        return {w.base_url: gate.capacity(w.base_url) for w in self.workers}

    async def not_ready_reasons(self, down: list[str] | None = None) -> list[str]:
        """What keeps the service from answering; `down`: the workers known to be down
        (else checked now)."""
        reasons = []
        if self.warm_up_error is not None:
            reasons.append(f"warm-up failed: {self.warm_up_error}")
        elif self.pipeline is None:
            reasons.append("warming up (embedder, index, chat template)")
        down = await self.workers_down() if down is None else down
        if len(down) == len(self.workers):  # one of several down: the others answer, and
            # /readyz should not take this replica out of its balancer for it
            reasons += [f"SGLang at {url} is not healthy" for url in down]
        return reasons

    async def workers_down(self) -> list[str]:
        healthy = await asyncio.gather(*(w.health(timeout_s=1.0) for w in self.workers))
        return [w.base_url for w, ok in zip(self.workers, healthy, strict=True) if not ok]

    async def aclose(self) -> None:
        tasks = (
            self._warm_up_task,
            self._reranker_task,
            self._watch_task,
            self._fleet_task,
            self._lag_task,
            self._keys_task,
        )
        for task in tasks:
            if task is not None and not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if self.retriever is not None:
            self.retriever.close()
        for worker in self.workers:
            await worker.drain()
        await self.http.aclose()
        if self.shared_requests is not None:
            await self.shared_requests.drain()
        if self.fleet is not None:
            await self.fleet.drain()
        if self.redis is not None:
            await self.redis.aclose()
        self.provider.shutdown()
        self.gc_pauses.remove()
        thaw_heap()
