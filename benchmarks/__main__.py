"""python -m benchmarks: run every benchmark and write benchmarks/RESULTS.md."""

import sys

from benchmarks.run import main

sys.exit(main())
