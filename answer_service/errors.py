"""Errors the service maps to HTTP answers and SSE `error` events.

    ServiceError                 base: carries an HTTP status and a stable `code`
    ├── InvalidRequestError      400/422: the request cannot be answered as asked
    ├── NotFoundError            404: no such thing (a passage id the index does not hold)
    ├── ConflictError            409: another writer holds the index, or the id is taken
    ├── UnsupportedMediaError    415: a document of a type the service cannot parse
    ├── NotReadyError            503: warm-up has not finished (index, models, chat template)
    ├── OverloadedError          503: no plan can make the budget now (with Retry-After)
    ├── UpstreamUnavailableError 503: SGLang cannot be reached
    │   └── RoutedWorkerLostError    the router could not reach its worker (asked again once)
    ├── StageTimeoutError        504: a stage overran its deadline before the stream began
    └── UpstreamError            502: SGLang refused or failed the request

Only this package turns errors of `retrieval/` and `generation/` into these.
"""

from __future__ import annotations


class ServiceError(Exception):
    status_code = 500
    code = "internal_error"

    def __init__(self, message: str, *, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_s = retry_after_s


class InvalidRequestError(ServiceError):
    status_code = 422
    code = "invalid_request"


class NotFoundError(ServiceError):
    status_code = 404
    code = "not_found"


class NotReadyError(ServiceError):
    status_code = 503
    code = "not_ready"


class OverloadedError(ServiceError):
    status_code = 503
    code = "overloaded"


class UpstreamUnavailableError(ServiceError):
    status_code = 503
    code = "generation_unavailable"


class RoutedWorkerLostError(UpstreamUnavailableError):
    """sglang-router lost the worker it chose; it passes that worker over from then on."""


class StageTimeoutError(ServiceError):
    status_code = 504
    code = "stage_timeout"


class UpstreamError(ServiceError):
    status_code = 502
    code = "generation_failed"


class UnauthorizedError(ServiceError):
    status_code = 401
    code = "unauthorized"


class ForbiddenError(ServiceError):
    status_code = 403
    code = "forbidden"


class ConflictError(ServiceError):
    status_code = 409
    code = "conflict"


class UnsupportedMediaError(ServiceError):
    status_code = 415
    code = "unsupported_media_type"


class PayloadTooLargeError(ServiceError):
    status_code = 413
    code = "payload_too_large"


class RateLimitedError(ServiceError):
    status_code = 429
    code = "rate_limited"
