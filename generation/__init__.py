"""Turning a question and its passages into a streamed answer from an SGLang server.

Lays the prompt out (the model's chat template, a fixed system prompt, the passages in a
cache-aware order (`prefix_order`), the question), picks the SGLang worker whose cache holds the
prompt's passages (`prefix_routing`), streams token deltas from SGLang's native `/generate` API
over one shared `httpx.AsyncClient` (`sglang_client`), aborts the server-side request when the
caller goes away, and starts or stops local SGLang servers (`server/`): one, or N workers
behind sglang-router.

May import: `budget/`, the standard library and third-party libraries. Never `retrieval/`,
`answer_service/` or `eval/`. `server/sglang_compat/` is not imported by anything here: it is
put on the SGLang server process's PYTHONPATH only.
"""
