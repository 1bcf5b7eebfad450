"""`answer-service`: the command line (index, serve, ask, sglang, keys, reranker, demo).

May import: everything in `answer_service/` and the packages below it.
"""
