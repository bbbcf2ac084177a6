"""The test suite (a package, so test files and tests/support/ import as ``tests.*``: see conftest.py)."""
