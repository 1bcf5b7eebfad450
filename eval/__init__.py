"""Measuring the service offline.

- `commands/`: `answer-eval` (retrieval, answers, load, report, calibrate-citations);
- `bench/`: benchmarks, one script each, indexed in `bench/README.md`;
- `calibrate/`: tools whose output the service loads;
- `lib/`: what those share (result files, metrics, the load engine, a service process).

May import: everything (`answer_service/`, `retrieval/`, `generation/`, `budget/`). Nothing
imports it.
"""
