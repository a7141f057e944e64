"""Fixtures for tests/bench live in bench_helpers.py (uniquely named: several test folders have a conftest)."""

from bench_helpers import offline_env  # noqa: F401
