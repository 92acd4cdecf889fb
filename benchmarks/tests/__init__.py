"""Tests of the benchmarks: each benchmark prints what its README table reads, from a tiny run."""
