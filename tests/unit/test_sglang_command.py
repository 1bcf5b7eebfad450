"""The SGLang server's argv and environment are pure functions of its config and the host's
facts (GPUs, the CPU's bf16, a reachable hub), passed in: both launch lines are tested here."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from generation.errors import SGLangServerError
from generation.server.host import Gpu, HostFacts, hub_reachable, parse_gpu_list
from generation.server.launch import (
    COMPAT_DIR,
    CPU_PREFIX_ATTENTION_ENV,
    SGLangServer,
    SGLangServerConfig,
    cpu_has_native_bf16,
)

PYTHON = Path("/venv/bin/python")
MODEL = Path("/models/tiny")
H200 = Gpu(0, "NVIDIA H200", 143_771)
GPU_BOX = HostFacts(gpus=(H200, Gpu(1, "NVIDIA H200", 143_771)), hub_reachable=True)
CPU_BOX = HostFacts(cpu_native_bf16=True)


def _flag_value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_cpu_command_has_cpu_flags_and_config_values() -> None:
    config = SGLangServerConfig(port=31234, load_format="dummy", max_total_tokens=4096)
    argv = SGLangServer(config).command(PYTHON, MODEL, "cpu")

    assert argv[:3] == [str(PYTHON), "-m", "sglang.launch_server"]
    assert _flag_value(argv, "--model-path") == str(MODEL)
    assert _flag_value(argv, "--host") == "127.0.0.1"
    assert _flag_value(argv, "--port") == "31234"
    assert _flag_value(argv, "--load-format") == "dummy"
    assert _flag_value(argv, "--max-total-tokens") == "4096"
    assert _flag_value(argv, "--device") == "cpu"
    assert _flag_value(argv, "--attention-backend") == "torch_native"
    assert _flag_value(argv, "--dtype") == "bfloat16"
    assert _flag_value(argv, "--grammar-backend") == "none"
    for flag in (
        "--disable-overlap-schedule",
        "--sleep-on-idle",
        "--enable-cache-report",
        "--enable-metrics",
    ):
        assert flag in argv
    assert "--incremental-streaming-output" not in argv
    assert "--context-length" not in argv


def test_cuda_command_uses_stock_flags_only() -> None:
    argv = SGLangServer(SGLangServerConfig()).command(PYTHON, "org/model", "cuda")

    assert argv == [
        str(PYTHON),
        "-m",
        "sglang.launch_server",
        "--model-path",
        "org/model",
        "--host",
        "127.0.0.1",
        "--port",
        "30000",
        "--enable-cache-report",
        "--enable-metrics",
    ], "no CPU flags, SGLang's own KV cache size and memory share, the hub id as given"


def test_cuda_command_passes_what_is_set() -> None:
    config = SGLangServerConfig(
        mem_fraction_static=0.72, max_total_tokens=100_000, load_format="dummy"
    )
    argv = SGLangServer(config).command(PYTHON, MODEL, "cuda")

    assert _flag_value(argv, "--mem-fraction-static") == "0.72"
    assert _flag_value(argv, "--max-total-tokens") == "100000"
    assert _flag_value(argv, "--load-format") == "dummy"
    cpu = SGLangServer(config).command(PYTHON, MODEL, "cpu")
    assert "--mem-fraction-static" not in cpu, "a GPU share means nothing on the CPU"
    assert (
        _flag_value(
            SGLangServer(SGLangServerConfig()).command(PYTHON, MODEL, "cpu"), "--max-total-tokens"
        )
        == "16384"
    )


def test_context_length_and_extra_args_are_appended() -> None:
    config = SGLangServerConfig(context_length=2048, extra_args=("--log-level", "warning"))
    argv = SGLangServer(config).command(PYTHON, MODEL, "cpu")

    assert _flag_value(argv, "--context-length") == "2048"
    assert argv[-2:] == ["--log-level", "warning"]


def test_command_is_pure() -> None:
    server = SGLangServer(SGLangServerConfig())
    assert server.command(PYTHON, MODEL, "cpu") == server.command(PYTHON, MODEL, "cpu")


def test_cpu_environment_puts_compat_only_on_server_path() -> None:
    server = SGLangServer(SGLangServerConfig())
    env = server.environment({"PYTHONPATH": "/x"}, "cpu")

    assert env["SGLANG_USE_CPU_ENGINE"] == "1"
    assert env["PYTHONPATH"].split(":") == [str(COMPAT_DIR), "/x"]
    assert (COMPAT_DIR / "sgl_kernel" / "__init__.py").is_file()


def test_cuda_environment_has_no_compat_path() -> None:
    env = SGLangServer(SGLangServerConfig(gpu_id=1)).environment({}, "cuda")

    assert "SGLANG_USE_CPU_ENGINE" not in env
    assert "PYTHONPATH" not in env
    assert CPU_PREFIX_ATTENTION_ENV not in env
    assert env["CUDA_VISIBLE_DEVICES"] == "1"


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_hub_is_forced_offline_only_where_none_answers(device: str) -> None:
    server = SGLangServer(SGLangServerConfig())
    offline = server.environment({"HF_TOKEN": "t"}, device, hub_reachable=False)
    online = server.environment({"HF_TOKEN": "t"}, device, hub_reachable=True)

    assert offline["HF_HUB_OFFLINE"] == offline["TRANSFORMERS_OFFLINE"] == "1"
    assert "HF_HUB_OFFLINE" not in online
    assert "TRANSFORMERS_OFFLINE" not in online
    assert online["HF_TOKEN"] == "t"
    kept = server.environment({"HF_HUB_OFFLINE": "0"}, device, hub_reachable=False)
    assert kept["HF_HUB_OFFLINE"] == "0", "the caller's own setting wins"


def test_hub_probe_trusts_an_offline_environment() -> None:
    assert not hub_reachable({"HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"})
    assert not hub_reachable({"HF_ENDPOINT": "http://127.0.0.1:9"}, timeout_s=1.0)


def test_launch_plan_follows_the_host() -> None:
    auto = SGLangServer(SGLangServerConfig(gpu_id=1, mem_fraction_static=0.5))
    on_gpu = auto.launch_plan(PYTHON, "org/model", GPU_BOX, {"PYTHONPATH": "/x"})
    on_cpu = auto.launch_plan(PYTHON, MODEL, CPU_BOX, {})

    assert on_gpu.device == "cuda"
    assert on_gpu.argv == tuple(auto.command(PYTHON, "org/model", "cuda"))
    assert on_gpu.env == {"PYTHONPATH": "/x", "CUDA_VISIBLE_DEVICES": "1"}
    assert on_cpu.device == "cpu"
    assert on_cpu.argv == tuple(auto.command(PYTHON, MODEL, "cpu", "bfloat16"))
    assert on_cpu.env["HF_HUB_OFFLINE"] == "1"
    avx2 = auto.launch_plan(PYTHON, MODEL, HostFacts(), {})
    assert _flag_value(list(avx2.argv), "--dtype") == "float32"
    forced = SGLangServer(SGLangServerConfig(device="cpu"))
    assert forced.launch_plan(PYTHON, MODEL, GPU_BOX, {}).device == "cpu"


def test_launch_plan_refuses_a_gpu_that_is_not_there() -> None:
    with pytest.raises(SGLangServerError, match="nvidia-smi lists none"):
        SGLangServer(SGLangServerConfig(device="cuda")).launch_plan(PYTHON, MODEL, CPU_BOX, {})
    with pytest.raises(SGLangServerError, match=r"no GPU 2 here \(nvidia-smi lists 0, 1\)"):
        SGLangServer(SGLangServerConfig(gpu_id=2)).launch_plan(PYTHON, MODEL, GPU_BOX, {})


def test_gpu_list_is_read_from_nvidia_smi() -> None:
    text = "0, NVIDIA H200, 143771\n1, NVIDIA H200, 143771\n\ngarbage\n"
    assert parse_gpu_list(text) == (H200, Gpu(1, "NVIDIA H200", 143_771))
    assert parse_gpu_list("") == ()


def test_url_and_default_paths(tmp_path: Path) -> None:
    server = SGLangServer(SGLangServerConfig(port=30001, cache_dir=tmp_path))

    assert server.url == "http://127.0.0.1:30001"
    assert server.pid_path == tmp_path / "run" / "sglang-30001.pid"
    assert server.log_path == tmp_path / "logs" / "sglang-30001.log"


def test_cpu_dtype_follows_the_cpu(tmp_path: Path) -> None:
    fp32 = SGLangServer(SGLangServerConfig()).command(PYTHON, MODEL, "cpu", "float32")
    assert _flag_value(fp32, "--dtype") == "float32"
    avx2 = tmp_path / "avx2"
    avx2.write_text("flags\t: fpu sse2 avx2 fma\n")
    bf16 = tmp_path / "sapphire"
    bf16.write_text("flags\t: fpu avx2 avx512f avx512_bf16 amx_bf16\n")
    assert not cpu_has_native_bf16(avx2)
    assert cpu_has_native_bf16(bf16)
    assert not cpu_has_native_bf16(tmp_path / "missing")
    pinned = SGLangServer(SGLangServerConfig(cpu_dtype="bfloat16"))
    assert pinned.resolved_cpu_dtype(HostFacts(cpu_native_bf16=False)) == "bfloat16"


def test_hub_probe_counts_an_answer_and_not_a_refusal() -> None:
    class Hub(BaseHTTPRequestHandler):
        status = 200

        def do_HEAD(self) -> None:
            self.send_response(self.status)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    try:
        assert hub_reachable({"HF_ENDPOINT": url})
        Hub.status = 403  # what a proxy that refuses the hub answers
        assert not hub_reachable({"HF_ENDPOINT": url})
    finally:
        server.shutdown()
        server.server_close()
