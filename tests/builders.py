"""Helper builders for tests: a small real index (real faiss and BM25 over a bag-of-words
embedder, no model weights) and an `AnswerPipeline` assembled from it and the in-repo fakes."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from answer_service.pipeline.answer_pipeline import AnswerPipeline, PipelineConfig
from answer_service.pipeline.forms import FormConfig
from answer_service.pipeline.generation_steps import GenerationConfig
from answer_service.pipeline.planning import PlanningConfig
from answer_service.pipeline.retrieval_steps import RetrievalConfig
from budget import Deadline
from budget.forms import AnswerMode
from budget.stage import Stage
from generation.client import GenerationClient
from retrieval.embedder import Embedder, Vectors
from retrieval.index.builder import build_index
from retrieval.passage import Passage
from retrieval.retriever import Retriever
from retrieval.sentences.answerable import AnswerableModel
from retrieval.sentences.quote import read_quote_config
from retrieval.sentences.reader import Reader, ReadMix
from retrieval.sentences.scorer import Candidate, ScoredSentence
from retrieval.sentences.span import ShortFinder
from retrieval.sentences.splitter import definition_terms, ends_as_sentence, split_sentences
from retrieval.sentences.store import EmbeddedPassages, SentenceRef
from retrieval.stages import SentenceRequest
from tests.fakes.hash_embedder import HashEmbedder
from tests.fakes.scripted_generation import ScriptedGeneration, words
from tests.fakes.word_template import WordTemplate

DOCUMENTS = {
    "tea": ("Green tea", "Green tea is steeped for two minutes in water at 80 degrees."),
    "coffee": ("Coffee", "Espresso is brewed by forcing hot water through ground coffee."),
    "volcano": ("Volcanoes", "Mount Etna is an active volcano on the island of Sicily."),
    "river": ("Rivers", "The Danube flows through ten countries into the Black Sea."),
    "moon": ("The Moon", "Apollo 11 landed on the Moon in July 1969."),
}


def make_index(
    directory: Path,
    documents: Mapping[str, tuple[str, str]] = DOCUMENTS,
    embedder: Embedder | None = None,
) -> Path:
    """An index directory over `documents` (id: (title, text)), built as the service builds."""
    corpus = directory / "corpus.jsonl"
    corpus.write_text(
        "".join(
            json.dumps({"_id": doc_id, "title": title, "text": text}) + "\n"
            for doc_id, (title, text) in documents.items()
        )
    )
    build_index(corpus, directory / "index", embedder or HashEmbedder(), progress=False)
    return directory / "index"


def make_pipeline(
    index_dir: Path,
    *,
    workers: Sequence[GenerationClient] | None = None,
    mode: str = "hybrid",
    planning: PlanningConfig | None = None,
    abstain_below: float | None = 0.0,
    answer_mode: AnswerMode = "passages",
    generation: GenerationConfig | None = None,
    query_stages: Sequence[Stage[str, str]] = (),
    short: ShortFinder | None = None,
    reader: tuple[Reader, ReadMix] | None = None,
    **config: Any,
) -> tuple[AnswerPipeline, InMemorySpanExporter]:
    """A pipeline over `index_dir` with the fakes (scripted generation, word template), and
    the exporter its spans end in. It answers from passages unless told another
    `answer_mode`, and never abstains unless given a threshold (None: the calibrated one); the
    quote's selection and the answerable model are the ones shipped; a quote's short answer
    comes from `short` (None: none), the reader's order from `reader` (None: the scorer's)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    retriever = Retriever.open(index_dir, HashEmbedder(), short=short, reader=reader)
    pipeline = AnswerPipeline(
        retriever,
        WordTemplate(),
        list(workers or [ScriptedGeneration(words("Green tea steeps for two minutes."))]),
        provider.get_tracer("test"),
        PipelineConfig(
            generation=generation or GenerationConfig(served_model="test/scripted"),
            retrieval=RetrievalConfig(floor_ms=250, mode=mode, depth=None, slack=0),
            planning=planning or PlanningConfig(enabled=False),
            abstain_below=abstain_below,
            forms=FormConfig(
                mode=answer_mode, quote=read_quote_config(), answerable=AnswerableModel.read()
            ),
            **config,
        ),
        query_stages=query_stages,
    )
    return pipeline, exporter


def slow_sentences(
    monkeypatch: pytest.MonkeyPatch, pipeline: AnswerPipeline, seconds: float
) -> None:
    """The pipeline's sentence scoring delayed by `seconds`: a prompt sent ahead of it is
    surely at the model (prefilling, or decoding) by the time the evidence is weighed."""
    stage = pipeline.retriever.sentences
    score = stage.run

    async def slowly(request: SentenceRequest, deadline: Deadline) -> object:
        await asyncio.sleep(seconds)
        return await score(request, deadline)

    monkeypatch.setattr(stage, "run", slowly)


def scored_page(text: str, probabilities: dict[str, float]) -> list[ScoredSentence]:
    """The units of one passage as the splitter finds them (a unit that does not end as a
    sentence is not whole, as `scorer.candidates` marks it), ranked by `probabilities` (by the
    start of their text; 0.01 for the rest)."""
    passage = Passage("page#0", "page", 0, "Page", text, 0, len(text))
    out = []
    spans = split_sentences(text)
    terms = definition_terms(text, spans)
    for position, (span, term) in enumerate(zip(spans, terms, strict=True)):
        unit = text[span.start : span.end]
        whole = span.kind != "prose" or ends_as_sentence(unit)
        ref = SentenceRef(position, 0, span.start, span.end, position, whole, span.kind)
        probability = next((p for t, p in probabilities.items() if unit.startswith(t)), 0.01)
        score = math.log(probability / (1 - probability))
        out.append(ScoredSentence(Candidate(ref, passage, 0, term), probability, score=score))
    return sorted(out, key=lambda s: -s.probability)


def without_sentence_vectors(passages: Sequence[Passage], vectors: Vectors) -> EmbeddedPassages:
    """Synthetic passages' vectors as the index writer takes them, their sentences' zero."""
    counts = tuple(len(split_sentences(passage.text)) for passage in passages)
    sentences = np.zeros((sum(counts), vectors.shape[1]), dtype=np.float16)
    return EmbeddedPassages(vectors, sentences, counts)
