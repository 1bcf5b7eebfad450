"""The SGLang server's argv and environment are pure functions of its config."""

from __future__ import annotations

from pathlib import Path

from generation.server.launch import (
    COMPAT_DIR,
    SGLangServer,
    SGLangServerConfig,
    cpu_has_native_bf16,
)

PYTHON = Path("/venv/bin/python")
MODEL = Path("/models/tiny")


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
    argv = SGLangServer(SGLangServerConfig()).command(PYTHON, MODEL, "cuda")

    for flag in ("--device", "--attention-backend", "--sleep-on-idle", "--grammar-backend"):
        assert flag not in argv
    assert _flag_value(argv, "--load-format") == "auto"


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
    env = SGLangServer(SGLangServerConfig()).environment({}, "cuda")

    assert "SGLANG_USE_CPU_ENGINE" not in env
    assert "PYTHONPATH" not in env


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
    assert pinned.resolved_cpu_dtype() == "bfloat16"
