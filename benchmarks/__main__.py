"""``python -m benchmarks [--quick] [--out DIR]``."""

from .cli import main

raise SystemExit(main())
