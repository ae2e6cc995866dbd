"""AMD GPUs through ROCm: the built-in ``rocm`` platform plugin.

This folder holds everything hwplug knows about it: ``platform.py`` (the
rules), ``probe.py`` (torch-free detection), ``profiles.py`` (simulated
devices), ``gfx.py`` (ISA names). The ``hwplug.platforms`` entry point
``rocm`` names this package.
"""

from __future__ import annotations

from hwplug.platforms.rocm.platform import (
    RocmPlatform,
    hwplug_platforms,
)

__all__ = [
    "RocmPlatform",
    "hwplug_platforms",
]
