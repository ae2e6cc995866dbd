"""Finding discrete Intel GPUs without torch: PCI vendor ``0x8086`` in sysfs.

Display-class functions bound to ``xe`` or ``i915`` that have device-local
memory count; integrated GPUs never do. ``ZE_AFFINITY_MASK`` applies.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from hwplug.core.platform import DeviceInfo
from hwplug.platforms.sysfs import (
    Found,
    PciFunction,
    apply_visibility,
    decimal,
    exists,
    memory_bytes,
    numbered,
    pci_functions,
    read_int,
    resolve_env,
    resolve_root,
)
from hwplug.platforms.xpu.profiles import PROFILES

__all__ = ["INTEL_VENDOR_ID", "probe_intel_gpu"]

logger = logging.getLogger("hwplug.probes")


INTEL_VENDOR_ID = 0x8086

_INTEL_GPU_DRIVERS = ("xe", "i915")

# Discrete Intel GPU families by PCI device id (include/drm/intel/pciids.h).
_INTEL_DISCRETE_FAMILIES: tuple[tuple[str, frozenset[int]], ...] = (
    (
        "pvc",
        frozenset({0x0B69, 0x0B6E, *range(0x0BD0, 0x0BDC), 0x0BE0, 0x0BE1, 0x0BE5}),
    ),
    (
        "dg2",
        frozenset(
            {*range(0x5690, 0x5698), *range(0x56A0, 0x56A7), *range(0x56B0, 0x56B4)}
            | {*range(0x56BA, 0x56C0), 0x56C0, 0x56C1, 0x56C2}
        ),
    ),
    (
        "bmg",
        frozenset(
            {0xE202, 0xE209, 0xE20B, 0xE20C, 0xE20D, 0xE210, 0xE211, 0xE212, 0xE215, 0xE216}
            | {0xE220, 0xE221, 0xE222, 0xE223}
        ),
    ),
    ("dg1", frozenset({0x4905, 0x4906, 0x4907, 0x4908, 0x4909})),
)

_INTEL_GPU_NAMES: dict[int, str] = {
    0x0BD5: PROFILES["max-1550"].name,
    0x0BDA: "Intel(R) Data Center GPU Max 1100",
    0x56A0: PROFILES["arc-a770"].name,
    0x56A1: "Intel(R) Arc(TM) A750 Graphics",
    0x56A5: "Intel(R) Arc(TM) A380 Graphics",
    0x56C0: "Intel(R) Data Center GPU Flex 170",
    0x56C1: "Intel(R) Data Center GPU Flex 140",
    0xE20B: PROFILES["arc-b580"].name,
}


def _intel_family(device_id: int) -> str | None:
    return next((arch for arch, ids in _INTEL_DISCRETE_FAMILIES if device_id in ids), None)


def _intel_local_memory(fn: PciFunction) -> int:
    """Device-local memory in bytes as the kernel driver publishes it, 0 if none.

    xe creates ``tile<N>/physical_vram_size_bytes`` under the PCI device only
    on discrete parts (newer kernels: ``tile<N>/memory/``); the i915 backport
    that drives Data Center GPUs publishes ``drm/card<N>/lmem_total_bytes``.
    Integrated GPUs publish neither. Upstream i915 publishes no such file,
    so a known discrete device id also counts (with memory unknown).
    """
    total = 0
    for _, tile in numbered(fn.path, "tile"):
        for path in (tile / "physical_vram_size_bytes", tile / "memory/physical_vram_size_bytes"):
            value = read_int(path) if exists(path) else None
            if value:
                total += value
                break
    if total:
        return total
    for _, card in numbered(fn.path / "drm", "card"):
        lmem = card / "lmem_total_bytes"
        value = read_int(lmem) if exists(lmem) else None
        if value:
            return value
    return 0


def _intel_affinity_resolver(entry: str) -> int | None:
    # "N" is device N; "N.M" is sub-device (tile) M of device N, which
    # selects device N here (hwplug counts cards, not tiles).
    card, dot, tile = entry.partition(".")
    if dot and decimal(tile) is None:
        return None
    return decimal(card)


def probe_intel_gpu(
    root: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
) -> list[DeviceInfo]:
    """Discrete Intel GPUs visible to this process; empty when there are none.

    A display-class PCI function of vendor ``0x8086`` counts when it is bound
    to the ``xe`` or ``i915`` driver and has device-local memory: xe's
    ``tile<N>/physical_vram_size_bytes``, i915's ``lmem_total_bytes``, or a
    known discrete device id (upstream i915 publishes no memory file). An
    integrated GPU never counts.
    ``ZE_AFFINITY_MASK`` applies (``"0,1"``, ``"0.0"``; empty means all).
    """
    root_path, env_map = resolve_root(root), resolve_env(env)
    found: list[Found] = []
    for fn in pci_functions(root_path, INTEL_VENDOR_ID):
        if not fn.is_display:
            continue
        if fn.driver not in _INTEL_GPU_DRIVERS:
            logger.debug(
                "intel: pci %s is bound to %s, not xe/i915; skipped", fn.address, fn.driver
            )
            continue
        arch = _intel_family(fn.device)
        memory = memory_bytes(_intel_local_memory(fn), fn.address)
        if not memory and arch is None:
            logger.debug(
                "intel: pci %s device %#06x has no device-local memory (integrated); skipped",
                fn.address,
                fn.device,
            )
            continue
        name = _INTEL_GPU_NAMES.get(fn.device) or f"Intel GPU [8086:{fn.device:04x}]"
        info = DeviceInfo(name=name, total_memory=memory, arch=arch, vendor="Intel")
        logger.debug("intel: pci %s: %s (%s, %d bytes local)", fn.address, name, arch, memory)
        found.append(Found(info))
    visible = apply_visibility(
        found,
        env_map,
        "ZE_AFFINITY_MASK",
        _intel_affinity_resolver,
        empty_means_all=True,
        collapse_repeats=True,
    )
    logger.debug("intel: %d discrete GPU(s) found, %d visible", len(found), len(visible))
    return [g.info for g in visible]
