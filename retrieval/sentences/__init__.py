"""Sentences of the passages: where they are (a splitter that survives abbreviations, decimals,
lists and code), their vectors stored with the index, and a scorer that says how likely each
answers a question, for quoted answers, focused context and a cheap reranker."""
