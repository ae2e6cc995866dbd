"""``python -m tiny_engine``."""

import sys

from tiny_engine.cli import main

sys.exit(main())
