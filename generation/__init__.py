"""Turning a question and its passages into a streamed answer from an SGLang server.

Lays the prompt out (the model's chat template, a fixed system prompt, the passages, the
question), streams token deltas from SGLang's native `/generate` API over one shared
`httpx.AsyncClient`, aborts the server-side request when the caller goes away, and starts or
stops a local SGLang server (`sglang_server`).

May import: `budget/`, the standard library and third-party libraries. Never `retrieval/`,
`answer_service/` or `eval/`. `sglang_compat/` is not imported by anything here: it is put on the
SGLang server process's PYTHONPATH only.
"""
