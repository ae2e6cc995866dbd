"""Simulated host CPUs."""

from __future__ import annotations

from hwplug.core.platform import DeviceInfo

__all__ = ["PROFILES"]

GiB = 1 << 30


PROFILES: dict[str, DeviceInfo] = {
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
}
"""Simulated CPUs, by profile name."""
