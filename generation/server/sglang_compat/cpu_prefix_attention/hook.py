"""Swap `kernel.patched_extend_method` into SGLang's ``TorchNativeAttnBackend`` when SGLang
imports ``sglang.srt.layers.attention.torch_native_backend``.

A meta-path finder wraps that one module's loader; after the module has run, the patch is
applied only if ``ANSWER_SGLANG_CPU_PREFIX_ATTENTION`` is not off, SGLang is the pinned version
and the method still has the signature the kernel was written against. Otherwise SGLang is left
untouched and one log line says why. Every other import passes straight through.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import inspect
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any

TARGET_MODULE = "sglang.srt.layers.attention.torch_native_backend"
TARGET_CLASS = "TorchNativeAttnBackend"
TARGET_METHOD = "_run_sdpa_forward_extend"
PINNED_SGLANG_VERSION = "0.5.23"
SWITCH_ENV = "ANSWER_SGLANG_CPU_PREFIX_ATTENTION"
OFF_VALUES = frozenset({"0", "false", "off", "no"})
EXPECTED_PARAMETERS = (
    "self",
    "query",
    "output",
    "k_cache",
    "v_cache",
    "req_to_token",
    "req_pool_indices",
    "seq_lens",
    "extend_prefix_lens",
    "extend_seq_lens",
    "encoder_lens",
    "scaling",
    "enable_gqa",
    "causal",
    "is_cross_attn",
    "sliding_window_size",
)

logger = logging.getLogger("sglang_compat.cpu_prefix_attention")


def _configure_logger() -> None:
    """SGLang re-configures the root logger with ``force=True``; our own handler survives it."""
    if logger.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("[%(asctime)s] %(name)s %(levelname)s %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def enabled(environ: Mapping[str, str]) -> bool:
    """Whether the switch allows the patch: on unless set to 0, false, off or no."""
    return environ.get(SWITCH_ENV, "1").strip().lower() not in OFF_VALUES


def _sglang_version() -> str | None:
    try:
        from sglang.version import __version__
    except ImportError:
        return None
    return str(__version__)


def patch(module: ModuleType) -> bool:
    """Replace the extend method on the backend class of ``module``; True if it was replaced."""
    _configure_logger()
    pid = os.getpid()
    if not enabled(os.environ):
        logger.info("cpu prefix attention off env=%s pid=%d", SWITCH_ENV, pid)
        return False
    version = _sglang_version()
    if version != PINNED_SGLANG_VERSION:
        logger.warning(
            "cpu prefix attention not installed: sglang version=%s, pinned=%s; "
            "sglang left untouched",
            version,
            PINNED_SGLANG_VERSION,
        )
        return False
    backend = getattr(module, TARGET_CLASS, None)
    original = getattr(backend, TARGET_METHOD, None)
    if backend is None or original is None:
        logger.warning(
            "cpu prefix attention not installed: %s.%s missing", TARGET_CLASS, TARGET_METHOD
        )
        return False
    parameters = tuple(inspect.signature(original).parameters)
    if parameters != EXPECTED_PARAMETERS:
        logger.warning(
            "cpu prefix attention not installed: unexpected signature %s; sglang left untouched",
            parameters,
        )
        return False
    from cpu_prefix_attention.kernel import patched_extend_method

    setattr(backend, TARGET_METHOD, patched_extend_method(original))
    logger.info("cpu prefix attention installed sglang=%s pid=%d", version, pid)
    return True


class _PatchingLoader(importlib.abc.Loader):
    """Runs the real loader, then `patch`; delegates everything else to the real loader."""

    def __init__(self, inner: importlib.abc.Loader) -> None:
        self._inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        patch(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class PatchOnImportFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for `TARGET_MODULE` it asks the finders behind it and wraps the
    loader they return."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != TARGET_MODULE:
            return None
        for finder in sys.meta_path:
            if finder is self or isinstance(finder, PatchOnImportFinder):
                continue
            find_spec = getattr(finder, "find_spec", None)
            spec = find_spec(fullname, path, target) if find_spec is not None else None
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _PatchingLoader(spec.loader)
        return spec


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once per process). Cheap: imports nothing."""
    if not any(isinstance(finder, PatchOnImportFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, PatchOnImportFinder())
