"""Local SGLang servers: the SGLang environments (CPU, and stock SGLang for GPUs) and models,
one server or N workers behind sglang-router, as child process groups found again through pid
files, launched as a pure function of their config and the host's facts (`host.py`), and the
CPU stand-ins (`sglang_compat/`).
"""
