"""Benchmarks: run each as a module (``python -m benchmarks.bench_<what>``); results in ``benchmarks/README.md``."""
