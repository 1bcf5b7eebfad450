"""Errors raised by `generation/`.

    GenerationError                  base of everything below
    ├── SGLangUnavailableError       the server cannot be reached or is not healthy
    ├── SGLangRequestError           the server refused or failed a request (carries the status)
    │   └── PromptTooLongError       the prompt does not fit the model's context
    ├── GenerationTimeoutError       no first token, or no next token, within the time allowed
    └── SGLangServerError            a local SGLang server, its venv or its model could not be made ready

httpx errors are wrapped at the boundary with `raise ... from exc`.
"""

from __future__ import annotations


class GenerationError(Exception):
    """Base class for generation failures."""


class SGLangUnavailableError(GenerationError):
    pass


class WorkerLostError(SGLangUnavailableError):
    """sglang-router could not reach the worker it chose for this request. The router passes
    that worker over from then on, so the same request sent again reaches another."""


class SGLangRequestError(GenerationError):
    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class PromptTooLongError(SGLangRequestError):
    pass


class GenerationTimeoutError(GenerationError):
    pass


class SGLangServerError(GenerationError):
    """The SGLang environment, model or server could not be made ready."""
