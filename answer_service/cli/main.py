"""`answer-service`: build an index, run SGLang and the service, ask questions, serve MCP over
stdio, run the demo."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from answer_service.cli.gpu_check import add_gpu_check_command
from answer_service.cli.keys import add_keys_commands
from answer_service.cli.reranker import add_reranker_commands
from answer_service.cli.sglang import add_sglang_commands
from answer_service.runtime.configs import experiment_of
from answer_service.runtime.settings import DEFAULT_SGLANG_PORT, Settings
from budget.forms import MODES

if TYPE_CHECKING:
    from retrieval.ingest.scan import SkippedFile

logger = logging.getLogger(__name__)

DEFAULT_SERVICE_PORT = 8000


def _index_build(args: argparse.Namespace) -> int:
    """Exit 0: all was indexed; 2: built, with files skipped; 1: nothing was built."""
    from retrieval.embedder import EmbedderConfig, SentenceTransformerEmbedder
    from retrieval.errors import RetrievalError
    from retrieval.index.ann import AnnConfig
    from retrieval.index.builder import build_index
    from retrieval.ingest.source import IngestOptions, open_source
    from retrieval.passage import ChunkingConfig

    try:
        source = open_source(args.paths, IngestOptions(args.collection, args.source_url))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    embedder = SentenceTransformerEmbedder(EmbedderConfig(model=args.embedder, device=args.device))
    try:
        report = build_index(
            source,
            args.out,
            embedder,
            chunking=ChunkingConfig(args.passage_tokens, args.overlap_tokens),
            ann=AnnConfig(kind=args.index_kind),
            batch_size=args.batch_size,
            force=args.force,
        )
    except (RetrievalError, OSError) as exc:
        _print_skipped(source.skipped)
        print(f"error: {exc}", file=sys.stderr)
        return 1
    manifest = report.manifest
    verb = "kept (already current)" if report.reused else f"built in {report.seconds:.1f} s"
    print(f"index {args.out}: {manifest.passage_count} passages, {manifest.dimension}-d, {verb}")
    return _print_skipped(report.skipped)


def _index_sync(args: argparse.Namespace) -> int:
    """Exit 0: in sync; 2: synced, with files skipped; 1: nothing was changed (an error)."""
    from retrieval.embedder import EmbedderConfig, SentenceTransformerEmbedder
    from retrieval.errors import RetrievalError
    from retrieval.index.sync import sync_index
    from retrieval.ingest.source import IngestOptions

    try:
        options = IngestOptions(args.collection, args.source_url)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    embedder = SentenceTransformerEmbedder(EmbedderConfig(model=args.embedder, device=args.device))
    try:
        report = sync_index(
            args.paths, args.index, embedder, options=options, batch_size=args.batch_size
        )
    except (RetrievalError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    revision = report.revision
    outcome = (
        f"generation {revision.generation.name} published in {revision.seconds:.1f} s"
        if revision.generation is not None
        else "already in sync, nothing published"
    )
    print(
        f"index {args.index}: {report.added} added, {report.changed} changed, "
        f"{report.removed} removed, {report.unchanged} unchanged; {revision.passages} passages "
        f"({revision.embedded_passages} embedded); {outcome}"
    )
    return _print_skipped(report.skipped)


def _print_skipped(skipped: Sequence[SkippedFile]) -> int:
    """List the files skipped with their reason; the exit code: 2 when a file could not be
    read, 0 when only navigation pages (tables of contents) were left out."""
    pages = [file for file in skipped if file.navigation_only]
    faults = [file for file in skipped if not file.navigation_only]
    if pages:
        print(f"{len(pages)} navigation page(s) not indexed (only a table of contents):")
        print("  " + ", ".join(file.path for file in pages[:5]) + (", ..." if pages[5:] else ""))
    if faults:
        print(f"{len(faults)} file(s) skipped:", file=sys.stderr)
    for file in faults:
        print(f"  {file.path}: {file.reason}", file=sys.stderr)
    return 2 if faults else 0


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from answer_service.http.api import create_app

    overrides: dict[str, object] = {"index_dir": args.index}
    if args.sglang_url:
        overrides["sglang_url"] = args.sglang_url
    if args.tokenizer:
        overrides["tokenizer"] = args.tokenizer
    settings = Settings(**overrides)  # type: ignore[arg-type]
    if args.gil_switch_ms is not None:
        # How long a thread holding the GIL (prompt rendering, planning, span export) may keep
        # the event loop's thread waiting before it must let go (measured by
        # eval/bench/refusal_latency.py, removed in issue 39, last at 51f22ed).
        sys.setswitchinterval(args.gil_switch_ms / 1000.0)
    try:
        experiment = experiment_of(args.experiment)
    except ValueError as exc:
        print(f"error: --experiment {exc}", file=sys.stderr)
        return 2
    uvicorn.run(
        create_app(settings, experiment),
        host=args.host,
        port=args.port,
        log_level="info",
        timeout_graceful_shutdown=10,
        # Longer than the idle expiry of client and proxy pools (httpx and HAProxy: 5 s), so
        # they close an idle connection first: a server closing it at the same moment races
        # a request just sent on it, which then fails before any response.
        timeout_keep_alive=args.keep_alive_s,
        # libuv's event loop and the C HTTP parser: a refusal, which is mostly HTTP, takes
        # less time than on asyncio's loop and h11 (the same removed benchmark).
        loop=args.server,
        http="httptools" if args.server == "uvloop" else "h11",
    )
    return 0


def _ask(args: argparse.Namespace) -> int:
    from answer_service.cli.ask import ask, converse

    if args.interactive or (args.question is None and sys.stdin.isatty()):
        return asyncio.run(
            converse(args.url, args.budget_ms, args.top_k, args.api_key, args.answer_mode)
        )
    if args.question is None:
        print("ask: give a question, or --interactive", file=sys.stderr)
        return 2
    return asyncio.run(
        ask(args.url, args.question, args.budget_ms, args.top_k, args.api_key, args.answer_mode)
    )


def _mcp(args: argparse.Namespace) -> int:
    from answer_service.mcp.stdio_proxy import serve_stdio

    asyncio.run(serve_stdio(args.url, args.api_key))
    return 0


def _demo(args: argparse.Namespace) -> int:
    from answer_service.cli.demo import run_demo, stop_demo

    if args.down:
        return stop_demo(args.port, args.sglang_port)
    return run_demo(args.port, args.sglang_port, args.question)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="answer-service", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    commands = parser.add_subparsers(dest="command", required=True)

    index = commands.add_parser("index", help="build a faiss index").add_subparsers(
        dest="index_command", required=True
    )
    build = index.add_parser(
        "build",
        help="chunk, embed and index files and folders (HTML, Markdown, text, PDF, JSONL)",
        description="Exit status: 0 when every file was indexed, 2 when the index was built "
        "with files skipped (listed with the reason), 1 when nothing was built.",
    )
    build.add_argument(
        "paths",
        type=Path,
        nargs="+",
        metavar="PATH",
        help="files and folders (read recursively): .html .htm .md .txt .pdf, or JSONL "
        "(.jsonl, .jsonl.gz) with _id, title, text a line",
    )
    build.add_argument(
        "--collection", default="default", help="recorded on every document (default: default)"
    )
    build.add_argument(
        "--source-url",
        metavar="PREFIX",
        help="the files' URLs: PREFIX + their path inside the folder given (a page's canonical "
        "link or front matter url: is used first)",
    )
    build.add_argument("--out", type=Path, required=True, help="index directory")
    build.add_argument("--embedder", default=Settings.model_fields["embedder_model"].default)
    build.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    build.add_argument("--passage-tokens", type=int, default=200)
    build.add_argument("--overlap-tokens", type=int, default=40)
    build.add_argument("--batch-size", type=int, default=64)
    build.add_argument(
        "--index-kind",
        choices=["auto", "flat", "ivf", "hnsw"],
        default="auto",
        help="auto: exact up to 50,000 passages, IVF above; hnsw is searched on the CPU only "
        "(faiss has no GPU HNSW)",
    )
    build.add_argument("--force", action="store_true", help="rebuild even if current")
    build.set_defaults(run=_index_build)

    sync = index.add_parser(
        "sync",
        help="re-scan files and folders; embed only new and changed documents, remove deleted",
        description="Publishes a new generation of the index in one atomic step; a serving "
        "process picks it up within ANSWER_INDEX_WATCH_S. Documents put over HTTP and files "
        "outside the paths given are kept. Exit status: 0 in sync, 2 synced with files "
        "skipped, 1 on error (the served generation is untouched).",
    )
    sync.add_argument("paths", type=Path, nargs="+", metavar="PATH")
    sync.add_argument("--index", type=Path, required=True, help="index directory")
    sync.add_argument("--collection", default="default")
    sync.add_argument("--source-url", metavar="PREFIX")
    sync.add_argument("--embedder", default=Settings.model_fields["embedder_model"].default)
    sync.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    sync.add_argument("--batch-size", type=int, default=64)
    sync.set_defaults(run=_index_sync)

    serve = commands.add_parser("serve", help="run the HTTP service")
    serve.add_argument("--index", type=Path, required=True)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=DEFAULT_SERVICE_PORT)
    serve.add_argument("--sglang-url", help="a running SGLang server (default: the local one)")
    serve.add_argument("--tokenizer", help="chat template source (default: the served model)")
    serve.add_argument(
        "--experiment",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an eval knob over the shipped one (answer_service/runtime/configs.py Experiment; "
        "repeatable), e.g. sentence_reader=false: for measurements, not for serving",
    )
    serve.add_argument(
        "--server",
        choices=("uvloop", "asyncio"),
        default="uvloop",
        help="uvloop: libuv's event loop and httptools (default); asyncio: the standard "
        "library's loop and h11",
    )
    serve.add_argument(
        "--keep-alive-s",
        type=int,
        default=75,
        help="how long an idle client connection is kept open (default 75 s)",
    )
    serve.add_argument(
        "--gil-switch-ms",
        type=float,
        default=None,
        help="the interpreter's thread switch interval (default: Python's, 5 ms)",
    )
    serve.set_defaults(run=_serve)

    ask = commands.add_parser("ask", help="stream an answer from a running service")
    ask.add_argument("question", nargs="?", help="none, at a terminal: --interactive")
    ask.add_argument(
        "--interactive",
        action="store_true",
        help="one question after another, as a conversation (follow-ups continue it)",
    )
    ask.add_argument("--url", default=f"http://127.0.0.1:{DEFAULT_SERVICE_PORT}")
    ask.add_argument("--budget-ms", type=int, default=None)
    ask.add_argument("--top-k", type=int, default=None)
    ask.add_argument(
        "--answer-mode", choices=MODES, default=None, help="default: the service's (ANSWER_MODE)"
    )
    ask.add_argument(
        "--api-key", default=os.environ.get("ANSWER_API_KEY"), help="default: $ANSWER_API_KEY"
    )
    ask.set_defaults(run=_ask)

    mcp = commands.add_parser(
        "mcp",
        help="an MCP server over stdio for desktop clients, proxying a running service",
        description="Serves the tools search, answer and get_passage over stdio (docs/mcp.md), "
        "each a call to the service at --url with the key given.",
    )
    mcp.add_argument("--url", default=f"http://127.0.0.1:{DEFAULT_SERVICE_PORT}")
    mcp.add_argument(
        "--api-key", default=os.environ.get("ANSWER_API_KEY"), help="default: $ANSWER_API_KEY"
    )
    mcp.set_defaults(run=_mcp)

    add_sglang_commands(commands)
    add_gpu_check_command(commands)

    demo = commands.add_parser("demo", help="index the bundled corpus, start all, ask")
    demo.add_argument("--port", type=int, default=DEFAULT_SERVICE_PORT)
    demo.add_argument("--sglang-port", type=int, default=DEFAULT_SGLANG_PORT)
    demo.add_argument("--question", default="How do I build an index without locking out writes?")
    demo.add_argument("--down", action="store_true", help="stop what the demo started")
    demo.set_defaults(run=_demo)
    add_reranker_commands(commands)
    add_keys_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    # faiss logs every instruction set it tries at INFO.
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)
    code: int = args.run(args)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
