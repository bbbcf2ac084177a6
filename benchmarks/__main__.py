"""``python -m benchmarks [--quick] [--sizes ...] [--dtypes ...] [--out DIR]``: see ``benchmarks.run``."""

from benchmarks.run import main

raise SystemExit(main())
