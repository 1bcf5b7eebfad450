"""The answer pipeline: a request's plan, its stages (retrieval, prompt, generation) run under
one deadline, the citations the service attributes, and the events that flow out.

May import: `budget/`, `retrieval/`, `generation/`, `answer_service.errors`. Never FastAPI,
`answer_service.http`, `answer_service.runtime` or `eval/`: `eval/` runs the same pipeline
in-process.
"""
