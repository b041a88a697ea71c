"""Benchmarks behind `orchestra-sup bench` (how to run them and what they mean: bench/README.md)."""
