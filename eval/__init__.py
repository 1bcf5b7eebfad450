"""The offline eval CLI (`answer-eval`): retrieval quality, answer quality with citations,
latency under load, and reports. It runs the same pipeline as the service, in-process or
against a running deployment.

May import: everything (`answer_service/`, `retrieval/`, `generation/`, `budget/`). Nothing
imports it.
"""
