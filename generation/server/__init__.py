"""Local SGLang servers: the SGLang environment and models, one server or N workers behind
sglang-router, as child process groups found again through pid files, and the CPU stand-ins
(`sglang_compat/`).
"""
