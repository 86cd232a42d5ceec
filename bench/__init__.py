"""Reproducible benchmarks; results in bench/RESULTS.md."""
