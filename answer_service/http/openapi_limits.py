"""The OpenAPI document states this deployment's own limits, not just the types: the maximum
budget, top_k and query length from the settings, the known tenant tiers, and that a query
needs a non-space character. Clients (and schemathesis) then learn what the service will
accept instead of finding out from 422s."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI

from answer_service.runtime.settings import Settings

_NOT_BLANK = r"\S"


def _integer(schema: dict[str, Any], maximum: int) -> None:
    for option in schema.get("anyOf", [schema]):
        if option.get("type") == "integer":
            option["maximum"] = maximum


def _limits(document: dict[str, Any], settings: Settings) -> None:
    schemas = document["components"]["schemas"]
    tiers = sorted(settings.tier_weights)
    for name in ("AnswerBody", "ChatCompletionBody", "ResponsesBody"):
        fields = schemas[name]["properties"]
        _integer(fields["ttft_budget_ms"], settings.max_ttft_budget_ms)
        _integer(fields["top_k"], settings.max_top_k)
    query = schemas["AnswerBody"]["properties"]["query"]
    query.update(maxLength=settings.max_query_chars, pattern=_NOT_BLANK)
    for option in schemas["ResponsesBody"]["properties"]["input"].get("anyOf", []):
        if option.get("type") == "string":  # the query itself
            option.update(maxLength=settings.max_query_chars, pattern=_NOT_BLANK)
    for name in ("ChatCompletionBody", "ResponsesBody"):
        for option in schemas[name]["properties"]["tier"].get("anyOf", []):
            if option.get("type") == "string":
                option["enum"] = tiers
    _integer(schemas["RetrieveBody"]["properties"]["top_k"], settings.max_retrieve_k)
    retrieve_query = schemas["RetrieveBody"]["properties"]["query"]
    retrieve_query.update(maxLength=settings.max_query_chars, pattern=_NOT_BLANK)
    for path in document["paths"].values():
        for operation in path.values():
            for parameter in operation.get("parameters", []):
                if parameter["name"] == "x-tenant-tier":
                    for option in parameter["schema"].get("anyOf", [parameter["schema"]]):
                        if option.get("type") == "string":
                            option["enum"] = tiers


def document_limits(app: FastAPI, settings: Settings) -> None:
    build: Callable[[], dict[str, Any]] = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = build()
            _limits(document, settings)
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
