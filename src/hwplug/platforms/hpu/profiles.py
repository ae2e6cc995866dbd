"""Simulated Intel Gaudi accelerators."""

from __future__ import annotations

from hwplug.core.platform import DeviceInfo

__all__ = ["PROFILES"]

GiB = 1 << 30


def _gaudi(name: str, memory_gib: int, arch: str, features: frozenset[str]) -> DeviceInfo:
    return DeviceInfo(
        name=name,
        total_memory=memory_gib * GiB,
        arch=arch,
        vendor="Intel Habana",
        features=features,
    )


PROFILES: dict[str, DeviceInfo] = {
    "gaudi": _gaudi("Intel Gaudi", 32, "gaudi", frozenset()),
    "gaudi2": _gaudi("Intel Gaudi 2", 96, "gaudi2", frozenset({"fp8"})),
    "gaudi3": _gaudi("Intel Gaudi 3", 128, "gaudi3", frozenset({"fp8"})),
}
"""Simulated Intel Gaudi accelerators, by profile name."""
