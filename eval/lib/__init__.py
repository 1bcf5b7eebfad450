"""What the commands and the benchmarks share: result files and checkpoints, answer metrics,
latency statistics, the load engine, a service as a child process, wire timing.
"""
