"""Non-test code the tests use: planted bugs (planted_bugs.py) and solutions (planted_solutions/) for crosscheck,
the OpInfo entries (opinfo_db.py)."""
