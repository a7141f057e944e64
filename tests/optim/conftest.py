"""Fixtures for tests/optim live in optim_helpers.py (uniquely named: several test folders have a conftest)."""

from optim_helpers import _eager_kernels  # noqa: F401
