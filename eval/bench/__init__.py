"""Benchmarks: one script each, run as `python -m eval.bench.<name>`; `README.md` lists each
with its command and the JSON it writes. Not part of `make test`; several read `../shared/data`.
"""
