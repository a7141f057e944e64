"""Benchmarks that print ratios measured in one process (`python -m altgrad.bench NAME`)."""
