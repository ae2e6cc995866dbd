"""Simulated AMD GPUs: memory in GiB, or the exact bytes rocm-smi reports."""

from __future__ import annotations

from hwplug.core.platform import DeviceCapability, DeviceInfo

__all__ = ["PROFILES"]

GiB = 1 << 30


def _amd(name: str, memory: int, arch: str, major: int, minor: int) -> DeviceInfo:
    return DeviceInfo(
        name=name,
        total_memory=memory,
        capability=DeviceCapability.parse((major, minor)),
        arch=arch,
        vendor="AMD",
    )


PROFILES: dict[str, DeviceInfo] = {
    "mi300x": _amd("AMD Instinct MI300X", 192 * GiB, "gfx942", 9, 4),
    "mi325x": _amd("AMD Instinct MI325X", 256 * GiB, "gfx942", 9, 4),
    "mi355x": _amd("AMD Instinct MI355X", 288 * GiB, "gfx950", 9, 5),
    # One MI250X package is two GCDs; each is a device with 64 GiB.
    "mi250x": _amd("AMD Instinct MI250X", 64 * GiB, "gfx90a", 9, 0),
    # rocm-smi's "VRAM Total Memory (B)" on an RX 7900 XTX.
    "rx7900xtx": _amd("AMD Radeon RX 7900 XTX", 25753026560, "gfx1100", 11, 0),
}
"""Simulated AMD GPUs, by profile name."""
