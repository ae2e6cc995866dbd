"""The host CPU: the built-in ``cpu`` platform plugin.

This folder holds everything hwplug knows about it: ``platform.py`` (the
rules), ``runtime.py`` (the device services), ``probe.py`` (torch-free
detection), ``profiles.py`` (simulated devices). The ``hwplug.platforms`` entry point
``cpu`` names this package.
"""

from __future__ import annotations

from hwplug.platforms.cpu.platform import (
    DEFAULT_STEP_GRAPH_SIZES,
    KVCACHE_SPACE_ENV,
    MIN_KVCACHE_SPACE,
    STEP_GRAPHS_ENV,
    CpuPlatform,
    hwplug_platforms,
)
from hwplug.platforms.cpu.runtime import CpuRuntime

__all__ = [
    "CpuPlatform",
    "CpuRuntime",
    "DEFAULT_STEP_GRAPH_SIZES",
    "KVCACHE_SPACE_ENV",
    "MIN_KVCACHE_SPACE",
    "STEP_GRAPHS_ENV",
    "hwplug_platforms",
]
