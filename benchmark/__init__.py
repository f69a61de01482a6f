"""Benchmark zoo runner: `python -m benchmark --help`."""
