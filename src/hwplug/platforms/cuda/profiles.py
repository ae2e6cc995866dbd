"""Simulated NVIDIA GPUs: totals as NVML (nvidia-smi) reports them, in MiB."""

from __future__ import annotations

from hwplug.core.platform import DeviceCapability, DeviceInfo

__all__ = ["PROFILES"]

MiB = 1 << 20


def _nvidia(name: str, memory_mib: int, major: int, minor: int) -> DeviceInfo:
    return DeviceInfo(
        name=name,
        total_memory=memory_mib * MiB,
        capability=DeviceCapability.parse((major, minor)),
        vendor="NVIDIA",
    )


PROFILES: dict[str, DeviceInfo] = {
    # Totals as NVML (nvidia-smi) reports them, in MiB.
    "b200": _nvidia("NVIDIA B200", 183359, 10, 0),
    "h100": _nvidia("NVIDIA H100 80GB HBM3", 81559, 9, 0),
    "h200": _nvidia("NVIDIA H200", 143771, 9, 0),
    "a100": _nvidia("NVIDIA A100-SXM4-80GB", 81920, 8, 0),
    "l4": _nvidia("NVIDIA L4", 23034, 8, 9),
    "rtx3090": _nvidia("NVIDIA GeForce RTX 3090", 24576, 8, 6),
    "t4": _nvidia("Tesla T4", 15360, 7, 5),
}
"""Simulated NVIDIA GPUs, by profile name."""
