"""Benchmarks and load tests, grouped by subject; the index is loadtests/README.md."""
