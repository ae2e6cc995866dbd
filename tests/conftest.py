"""Settings for the whole suite.

The CPU platform builds host step graphs (a compilation of the whole model per
decode size) for every engine it compiles; the suite builds hundreds of engines,
so it runs without them unless a test turns them on
(tests/compilation/test_step_graphs.py does). A value set outside is kept.
"""

from __future__ import annotations

import os

os.environ.setdefault("HWPLUG_CPU_STEP_GRAPHS", "0")
