"""AMD ISA names: ``gfx942`` and friends, as ROCm tools report them.

``gfx<major><minor><stepping>`` with the last two as hex digits; torch reports
``(major, minor)`` as the device capability on ROCm.
"""

from __future__ import annotations

import re

from hwplug.core.platform import DeviceCapability

__all__ = ["gfx_arch_name", "gfx_capability", "gfx_version"]


_GFX = re.compile(r"^gfx([0-9]{1,2})([0-9a-f])([0-9a-f])$")


def gfx_version(arch: str | None) -> tuple[int, int, int] | None:
    """``"gfx90a"`` -> ``(9, 0, 10)``; ``"gfx1100"`` -> ``(11, 0, 0)``; None if not a gfx name.

    Feature suffixes such as ``gfx942:sramecc+:xnack-`` are ignored.
    """
    if not arch:
        return None
    base = arch.strip().lower().split(":", 1)[0]
    match = _GFX.match(base)
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2), 16), int(match.group(3), 16)


def gfx_arch_name(target: object) -> str | None:
    """A gfx arch name from what ROCm tools report: ``"gfx942"`` or the number ``90402``.

    Feature suffixes (``gfx942:sramecc+:xnack-``) are dropped; None for anything else.
    """
    if isinstance(target, str):
        name = target.strip().lower().split(":", 1)[0]
        return name if gfx_version(name) is not None else None
    if isinstance(target, int) and not isinstance(target, bool) and target > 0:
        major, minor, step = target // 10000, target // 100 % 100, target % 100
        if minor > 15 or step > 15:
            return None
        return f"gfx{major}{minor:x}{step:x}"
    return None


def gfx_capability(arch: str | None) -> DeviceCapability | None:
    """The ``(major, minor)`` capability torch reports on ROCm for a gfx arch."""
    version = gfx_version(arch)
    return None if version is None else DeviceCapability(version[0], version[1])
