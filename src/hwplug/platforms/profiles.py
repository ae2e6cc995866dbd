"""Simulated device profiles: real devices described as data.

A profile is a :class:`~hwplug.core.platform.DeviceInfo` for one real device,
with the name, memory, compute capability or ISA generation that the device
itself reports. ``HWPLUG_SIMULATE=h100:8`` (or ``use_platform("h100:8")``)
runs every platform rule against such a device without the hardware.

Memory is the total the vendor's management tool reports where that figure is
known exactly (NVML's total for the NVIDIA parts, ``rocm-smi`` for the
RX 7900 XTX), otherwise the nominal capacity in GiB (2**30 bytes).

Profile names are unique across platforms, so a bare name such as ``mi300x``
identifies its platform (:func:`find_profile`). Nothing here imports torch.
"""

from __future__ import annotations

from hwplug.core.errors import ConfigError
from hwplug.core.platform import DeviceCapability, DeviceInfo, parse_profile_spec

__all__ = ["PROFILES", "all_profiles", "find_profile"]

MiB = 1 << 20
GiB = 1 << 30


def _nvidia(name: str, memory_mib: int, major: int, minor: int) -> DeviceInfo:
    return DeviceInfo(
        name=name,
        total_memory=memory_mib * MiB,
        capability=DeviceCapability.parse((major, minor)),
        vendor="NVIDIA",
    )


def _amd(name: str, memory: int, arch: str, major: int, minor: int) -> DeviceInfo:
    return DeviceInfo(
        name=name,
        total_memory=memory,
        capability=DeviceCapability.parse((major, minor)),
        arch=arch,
        vendor="AMD",
    )


def _gaudi(name: str, memory_gib: int, arch: str, features: frozenset[str]) -> DeviceInfo:
    return DeviceInfo(
        name=name,
        total_memory=memory_gib * GiB,
        arch=arch,
        vendor="Intel Habana",
        features=features,
    )


def _intel_gpu(name: str, memory_gib: int, arch: str) -> DeviceInfo:
    return DeviceInfo(name=name, total_memory=memory_gib * GiB, arch=arch, vendor="Intel")


PROFILES: dict[str, dict[str, DeviceInfo]] = {
    "cuda": {
        # Totals as NVML (nvidia-smi) reports them, in MiB.
        "b200": _nvidia("NVIDIA B200", 183359, 10, 0),
        "h100": _nvidia("NVIDIA H100 80GB HBM3", 81559, 9, 0),
        "h200": _nvidia("NVIDIA H200", 143771, 9, 0),
        "a100": _nvidia("NVIDIA A100-SXM4-80GB", 81920, 8, 0),
        "l4": _nvidia("NVIDIA L4", 23034, 8, 9),
        "rtx3090": _nvidia("NVIDIA GeForce RTX 3090", 24576, 8, 6),
        "t4": _nvidia("Tesla T4", 15360, 7, 5),
    },
    "rocm": {
        "mi300x": _amd("AMD Instinct MI300X", 192 * GiB, "gfx942", 9, 4),
        "mi325x": _amd("AMD Instinct MI325X", 256 * GiB, "gfx942", 9, 4),
        "mi355x": _amd("AMD Instinct MI355X", 288 * GiB, "gfx950", 9, 5),
        # One MI250X package is two GCDs; each is a device with 64 GiB.
        "mi250x": _amd("AMD Instinct MI250X", 64 * GiB, "gfx90a", 9, 0),
        # rocm-smi's "VRAM Total Memory (B)" on an RX 7900 XTX.
        "rx7900xtx": _amd("AMD Radeon RX 7900 XTX", 25753026560, "gfx1100", 11, 0),
    },
    "hpu": {
        "gaudi": _gaudi("Intel Gaudi", 32, "gaudi", frozenset()),
        "gaudi2": _gaudi("Intel Gaudi 2", 96, "gaudi2", frozenset({"fp8"})),
        "gaudi3": _gaudi("Intel Gaudi 3", 128, "gaudi3", frozenset({"fp8"})),
    },
    "cpu": {
        "cpu-generic": DeviceInfo(
            name="Generic x86-64 CPU (AVX2)",
            total_memory=64 * GiB,
            arch="x86_64",
            features=frozenset({"avx2"}),
        ),
        # A two-socket Sapphire Rapids server.
        "xeon-spr": DeviceInfo(
            name="Intel(R) Xeon(R) Platinum 8480+",
            total_memory=512 * GiB,
            arch="x86_64",
            vendor="Intel",
            features=frozenset({"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "ipex"}),
        ),
    },
    "xpu": {
        "max-1550": _intel_gpu("Intel(R) Data Center GPU Max 1550", 128, "pvc"),
        "arc-a770": _intel_gpu("Intel(R) Arc(TM) A770 Graphics", 16, "dg2"),
        "arc-b580": _intel_gpu("Intel(R) Arc(TM) B580 Graphics", 12, "bmg"),
    },
}
"""Simulated devices by platform name, then profile name."""


def all_profiles() -> dict[str, str]:
    """Every profile name mapped to the name of its platform."""
    return {profile: platform for platform, table in PROFILES.items() for profile in table}


def find_profile(name: str) -> tuple[str, DeviceInfo]:
    """The platform name and device of profile ``name``.

    ``name`` is case-insensitive; a device count suffix (``"h100:8"``) is
    accepted and ignored here (see ``parse_profile_spec``). An unknown name
    raises :class:`~hwplug.core.errors.ConfigError` listing every known profile.
    """
    if not isinstance(name, str):
        raise ConfigError(f"device profile must be a string such as 'h100', got {name!r}")
    profile, _count = parse_profile_spec(name)
    for platform, table in PROFILES.items():
        if profile in table:
            return platform, table[profile]
    known = ", ".join(sorted(all_profiles()))
    raise ConfigError(f"unknown device profile {profile!r}; known profiles: {known}")
