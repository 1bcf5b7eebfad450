"""`answer-eval`: the offline evaluation commands (retrieval, answers, load, report,
calibrate-citations) and their entry point.
"""
