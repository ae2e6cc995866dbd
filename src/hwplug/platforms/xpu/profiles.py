"""Simulated discrete Intel GPUs."""

from __future__ import annotations

from hwplug.core.platform import DeviceInfo

__all__ = ["PROFILES"]

GiB = 1 << 30


def _intel_gpu(name: str, memory_gib: int, arch: str) -> DeviceInfo:
    return DeviceInfo(name=name, total_memory=memory_gib * GiB, arch=arch, vendor="Intel")


PROFILES: dict[str, DeviceInfo] = {
    "max-1550": _intel_gpu("Intel(R) Data Center GPU Max 1550", 128, "pvc"),
    "arc-a770": _intel_gpu("Intel(R) Arc(TM) A770 Graphics", 16, "dg2"),
    "arc-b580": _intel_gpu("Intel(R) Arc(TM) B580 Graphics", 12, "bmg"),
}
"""Simulated Intel GPUs, by profile name."""
