"""Finding the passages that answer a question.

Reads a JSONL corpus, splits documents into token windows (`Passage`), embeds them with a
sentence-transformers model, keeps them in a faiss index saved with a manifest, and answers
queries with scored passages. Blocking model and faiss calls run on a bounded thread pool
owned by the stage, never on the caller's event loop.

May import: `budget/`, the standard library and third-party libraries. Never `generation/`,
`answer_service/` or `eval/`.
"""
