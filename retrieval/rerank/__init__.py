"""Reranking: the `Reranker` protocol, its implementations and the factory that builds one
from configuration; fine-tuning a cross-encoder on a corpus's judgments.
"""
