"""Strata's benchmarks, run as ``python -m bench.NAME`` from the repository root (bench/README.md)."""
