"""Benchmarks and soaks, each printing one JSON line: `python -m scripts.benchmarks.<name> --help`."""
