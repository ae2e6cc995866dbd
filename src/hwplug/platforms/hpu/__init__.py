"""Intel Gaudi accelerators (HPU): the built-in ``hpu`` platform plugin.

This folder holds everything hwplug knows about it: ``platform.py`` (the
rules), ``probe.py`` (torch-free detection), ``profiles.py`` (simulated
devices), ``graphs.py`` (its graph backend). The ``hwplug.platforms`` entry point
``hpu`` names this package.
"""

from __future__ import annotations

from hwplug.platforms.hpu.platform import (
    HpuPlatform,
    hwplug_platforms,
)

__all__ = [
    "HpuPlatform",
    "hwplug_platforms",
]
