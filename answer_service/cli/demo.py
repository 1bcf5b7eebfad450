"""`answer-service demo`: index the bundled corpus, start SGLang and the service, ask, leave up.

Every step is idempotent: a current index is kept, a healthy SGLang server or service that this
command started before is reused, so a second run goes straight to the question.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from answer_service.cli.ask import ask
from answer_service.cli.manual import SOURCE_URL, manual_pages
from answer_service.cli.sglang import launcher
from answer_service.runtime.placement import PlacementError
from answer_service.runtime.settings import Settings
from generation.server.fleet import SGLangFleet
from generation.server.host import HostFacts, detect_host
from generation.server.launch import (
    SGLangServer,
    SGLangServerConfig,
    SGLangServerError,
    ensure_sglang_env,
)
from retrieval.embedder import EmbedderConfig, SentenceTransformerEmbedder
from retrieval.index.builder import build_index
from retrieval.ingest.source import IngestOptions, open_source

_READY_TIMEOUT_S = 300.0

logger = logging.getLogger(__name__)


def _readiness(url: str) -> tuple[bool, list[str]]:
    """Whether the service at `url` is ready, and the reasons /readyz gives when not (none
    while it does not answer yet)."""
    try:
        with urllib.request.urlopen(f"{url}/readyz", timeout=2.0) as response:
            return bool(response.status == 200), []
    except urllib.error.HTTPError as exc:
        try:
            reasons = json.loads(exc.read()).get("reasons", [])
        except (ValueError, AttributeError, OSError):
            reasons = []
        return False, [str(r) for r in reasons]
    except (urllib.error.URLError, OSError):
        return False, []


def _pid_file(cache_dir: Path, port: int) -> Path:
    return cache_dir / "run" / f"service-{port}.pid"


def _start_service(settings: Settings, index_dir: Path, port: int, sglang_url: str) -> str:
    url = f"http://127.0.0.1:{port}"
    if _readiness(url)[0]:
        print(f"service already running at {url}")
        return url
    log_path = settings.cache_dir / "logs" / f"service-{port}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    pid_file = _pid_file(settings.cache_dir, port)
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    argv = [
        sys.executable,
        "-m",
        "answer_service.cli.main",
        "serve",
        "--index",
        str(index_dir),
        "--port",
        str(port),
        "--sglang-url",
        sglang_url,
    ]
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
    pid_file.write_text(f"{process.pid}\n")
    print(f"starting the service at {url} (log: {log_path})")
    try:
        _wait_ready(url, process, log_path)
    except RuntimeError:
        # Not left running half-started on the port, where the next run would collide with it.
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        pid_file.unlink(missing_ok=True)
        raise
    return url


def _wait_ready(url: str, process: subprocess.Popen[bytes], log_path: Path) -> None:
    deadline_s = time.monotonic() + _READY_TIMEOUT_S
    while not (readiness := _readiness(url))[0]:
        if process.poll() is not None:
            raise RuntimeError(f"the service exited with {process.returncode}; see {log_path}")
        # A failed warm-up is final (a missing index, weights that do not match the code): say
        # why now rather than wait out the timeout. SGLang not healthy yet is not.
        failed = [r for r in readiness[1] if r.startswith("warm-up failed")]
        if failed:
            raise RuntimeError(f"the service cannot start: {failed[0]}; see {log_path}")
        if time.monotonic() > deadline_s:
            raise RuntimeError(f"the service was not ready in {_READY_TIMEOUT_S:.0f} s")
        time.sleep(0.5)


def _prepare_sglang(server: SGLangServer | SGLangFleet, host: HostFacts) -> threading.Thread:
    """SGLang's environment and model made ready in the background (on a first run, pip
    installs that wait mostly on the network and the disk) while the index builds."""

    def prepare() -> None:
        if not isinstance(server, SGLangServer):
            return
        try:
            device = server.resolved_device(host)
            ensure_sglang_env(server.config.cache_dir, device)
            server.model_or_default(device)
        except SGLangServerError as exc:
            # Starting SGLang (step 2) tries again and reports what fails.
            logger.warning("sglang set-up beside the index build failed error=%s", exc)

    thread = threading.Thread(target=prepare, name="sglang-setup", daemon=True)
    thread.start()
    return thread


def run_demo(port: int, sglang_port: int, question: str) -> int:
    settings = Settings()
    started_s = time.monotonic()
    host = detect_host()
    try:
        # As `sglang up` would: on a GPU, leaving room for the service's own models there.
        sglang = launcher(settings, host, port=sglang_port)
    except PlacementError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    preparing = _prepare_sglang(sglang, host)
    index_dir = settings.cache_dir / "indexes" / "postgresql-15"
    print(f"1/4 indexing the PostgreSQL 15 manual's HTML pages into {index_dir}")
    pages = manual_pages(settings.cache_dir)
    source = open_source([pages], IngestOptions(source_url=SOURCE_URL))
    embedder = SentenceTransformerEmbedder(
        EmbedderConfig(model=settings.embedder_model, cache_dir=settings.cache_dir)
    )
    report = build_index(source, index_dir, embedder)
    state = "current, kept" if report.reused else f"built in {report.seconds:.0f} s"
    print(f"    {report.manifest.passage_count} passages ({state})")
    print(f"2/4 starting SGLang on port {sglang_port} (first run builds its environment)")
    preparing.join()
    try:
        sglang_url = sglang.start(host)
    except SGLangServerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"    SGLang at {sglang_url}")
    print("3/4 starting the answer service")
    try:
        url = _start_service(settings, index_dir, port, sglang_url)
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"4/4 asking: {question}\n")
    code = asyncio.run(ask(url, question, None, None))
    # The default (`auto`) quotes the manual when quoting measures best for the served model,
    # as it does for SmolLM2-135M: the model's own answer, from the best sentences, for contrast.
    if code == 0:
        print("\nThe model's answer, from the best sentences (answer_mode focused):\n")
        code = asyncio.run(ask(url, question, None, None, answer_mode="focused"))
    print(f"\nset-up and answer took {time.monotonic() - started_s:.0f} s")
    print(f"The service is up at {url} (POST /v1/answer, GET /readyz, GET /v1/traces).")
    print(f'Ask more: answer-service ask "your question" --url {url}')
    print("Stop it all: answer-service demo --down")
    return code


def stop_demo(port: int, sglang_port: int) -> int:
    settings = Settings()
    pid_file = _pid_file(settings.cache_dir, port)
    if pid_file.is_file():
        pid = int(pid_file.read_text().strip())
        try:
            os.killpg(pid, signal.SIGTERM)
            print(f"service (pid {pid}) stopped")
        except ProcessLookupError:
            print("service was not running")
        pid_file.unlink(missing_ok=True)
    stopped = SGLangServer(
        SGLangServerConfig(port=sglang_port, cache_dir=settings.cache_dir)
    ).stop()
    print("SGLang stopped" if stopped else "SGLang was not running")
    return 0
