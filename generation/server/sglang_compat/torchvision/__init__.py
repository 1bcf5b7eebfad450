"""Inert stand-in for ``torchvision`` (SGLang server process only).

SGLang imports torchvision at start-up through its multimodal config modules, and once a
``torchvision`` is importable transformers' image utilities import ``torchvision.io``,
``torchvision.transforms.v2.functional`` and friends at module level too. PyPI's wheels fail
to import next to the CPU torch. Text-only serving never calls any of it, so every
``torchvision.*`` submodule resolves to an empty module and every attribute to a placeholder
class: importing works, using one raises ``RuntimeError``.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Sequence
from typing import Any, NoReturn

__version__ = "0.0.0+sglang.compat"


class _Unavailable(type):
    """Metaclass of placeholders: attributes are more placeholders, calls fail loudly."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        child = _placeholder(f"{cls.__qualname__}.{name}")
        type.__setattr__(cls, name, child)  # same object on every access: stable dict keys
        return child

    def __call__(cls, *args: Any, **kwargs: Any) -> NoReturn:
        raise RuntimeError(
            f"torchvision.{cls.__qualname__} is not available: this is the inert stand-in from "
            "generation/sglang_compat (text-only serving on the CPU)"
        )


def _placeholder(qualname: str) -> type:
    name = qualname.rsplit(".", 1)[-1]
    return _Unavailable(name, (), {"__qualname__": qualname, "__module__": "torchvision"})


def _module_getattr(module_name: str) -> Any:
    prefix = module_name.removeprefix("torchvision").lstrip(".")
    cache: dict[str, type] = {}

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if name not in cache:
            cache[name] = _placeholder(f"{prefix}.{name}" if prefix else name)
        return cache[name]

    return __getattr__


class _InertLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        module.__path__ = []
        module.__getattr__ = _module_getattr(module.__name__)  # type: ignore[method-assign]


class _InertFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(f"{__name__}."):
            return None
        return importlib.machinery.ModuleSpec(fullname, _InertLoader(), is_package=True)


__getattr__ = _module_getattr(__name__)

if not any(isinstance(finder, _InertFinder) for finder in sys.meta_path):
    sys.meta_path.append(_InertFinder())
