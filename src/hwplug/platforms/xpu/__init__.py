"""Intel discrete GPUs (XPU): the built-in ``xpu`` platform plugin.

This folder holds everything hwplug knows about it: ``platform.py`` (the
rules), ``probe.py`` (torch-free detection), ``profiles.py`` (simulated
devices). The ``hwplug.platforms`` entry point
``xpu`` names this package.
"""

from __future__ import annotations

from hwplug.platforms.xpu.platform import (
    XpuPlatform,
    hwplug_platforms,
    xpu_dist_backend,
)

__all__ = [
    "XpuPlatform",
    "hwplug_platforms",
    "xpu_dist_backend",
]
