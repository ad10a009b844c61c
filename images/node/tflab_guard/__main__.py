"""`python -m tflab_guard` (the zipapp's own __main__ does the same)."""

import sys

from tflab_guard.cli import main

sys.exit(main())
