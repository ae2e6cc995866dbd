"""NVIDIA GPUs through CUDA: the built-in ``cuda`` platform plugin.

This folder holds everything hwplug knows about it: ``platform.py`` (the
rules), ``probe.py`` (torch-free detection), ``profiles.py`` (simulated
devices). The ``hwplug.platforms`` entry point
``cuda`` names this package.
"""

from __future__ import annotations

from hwplug.platforms.cuda.platform import (
    CudaPlatform,
    hwplug_platforms,
)

__all__ = [
    "CudaPlatform",
    "hwplug_platforms",
]
