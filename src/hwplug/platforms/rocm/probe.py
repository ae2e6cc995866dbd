"""Finding AMD GPUs without torch: amdsmi, else the KFD topology in sysfs.

amdsmi knows names, memory and the ISA exactly. Without it, the KFD topology
``/sys/class/kfd/kfd/topology/nodes/*`` gives each node's ``properties``
(``gfx_target_version`` is 0 on CPU nodes), memory banks and ``name``.
``ROCR_VISIBLE_DEVICES`` then ``HIP_VISIBLE_DEVICES`` (or
``CUDA_VISIBLE_DEVICES``, which HIP also reads) apply.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hwplug.core.platform import DeviceInfo
from hwplug.platforms.rocm.gfx import gfx_arch_name, gfx_capability
from hwplug.platforms.sysfs import (
    AMDSMI,
    Found,
    apply_visibility,
    is_host_root,
    memory_bytes,
    numbered,
    prop_int,
    query_library,
    read_properties,
    read_text,
    resolve_env,
    resolve_root,
    uuid_resolver,
)

__all__ = ["probe_amd"]

logger = logging.getLogger("hwplug.probes")


_AMD_PCI_IDS: dict[int, str] = {
    0x74A1: "AMD Instinct MI300X",
    0x74A0: "AMD Instinct MI300A",
    0x74A2: "AMD Instinct MI308X",
    0x74A5: "AMD Instinct MI325X",
    0x740C: "AMD Instinct MI250X / MI250",
    0x740F: "AMD Instinct MI210",
    0x738C: "AMD Instinct MI100",
}

_AMD_ARCH_NAMES: dict[str, str] = {
    "gfx908": "AMD Instinct MI100",
    "gfx90a": "AMD Instinct MI200 series",
    "gfx942": "AMD Instinct MI300 series",
    "gfx950": "AMD Instinct MI350 series",
    "gfx1100": "AMD Radeon RX 7900 series",
    "gfx1101": "AMD Radeon RX 7800/7700 series",
    "gfx1200": "AMD Radeon RX 9060 series",
    "gfx1201": "AMD Radeon RX 9070 series",
}

# HSA heap types of device-local memory banks (frame buffer public / private).
_KFD_LOCAL_HEAPS = {1, 2}


def _amd_name(device_id: int | None, arch: str, asic: str) -> str:
    if device_id in _AMD_PCI_IDS:
        return _AMD_PCI_IDS[device_id]
    if arch in _AMD_ARCH_NAMES:
        return _AMD_ARCH_NAMES[arch]
    # KFD's ``name`` is the lower-cased ASIC name ("aldebaran", or "ip discovery").
    if asic and asic != "ip discovery":
        return f"AMD GPU {asic} ({arch})"
    return f"AMD GPU ({arch})"


def _kfd_memory(node: Path) -> int:
    total = local = 0
    saw_heap_type = False
    for _, bank in numbered(node / "mem_banks", ""):
        props = read_properties(bank / "properties")
        size = prop_int(props, "size_in_bytes") or 0
        heap = prop_int(props, "heap_type")
        total += size
        if heap is not None:
            saw_heap_type = True
            if heap in _KFD_LOCAL_HEAPS:
                local += size
    return local if saw_heap_type else total


def _kfd_gpus(root: Path) -> list[Found]:
    found = []
    for index, node in numbered(root / "sys/class/kfd/kfd/topology/nodes", ""):
        props = read_properties(node / "properties")
        version = prop_int(props, "gfx_target_version")
        if not version:
            logger.debug("amd: KFD node %d has no gfx_target_version (a CPU node)", index)
            continue
        arch = gfx_arch_name(version)
        if arch is None:
            logger.debug("amd: KFD node %d: gfx_target_version %d is not an ISA", index, version)
            continue
        capability = gfx_capability(arch)
        asic = (read_text(node / "name") or "").strip()
        name = _amd_name(prop_int(props, "device_id"), arch, asic)
        unique_id = prop_int(props, "unique_id")
        info = DeviceInfo(
            name=name,
            total_memory=memory_bytes(_kfd_memory(node), node),
            capability=capability,
            arch=arch,
            vendor="AMD",
        )
        logger.debug("amd: KFD node %d: %s %s", index, name, arch)
        # ROCr names a GPU "GPU-<unique_id as 16 hex digits>".
        uuid = f"GPU-{unique_id:016x}" if unique_id else None
        found.append(Found(info, uuid))
    return found


def _amdsmi_gpus() -> list[Found] | None:
    """Every GPU amdsmi reports, or None when amdsmi is absent or fails."""

    def query(amdsmi: Any) -> list[Found]:
        found = []
        for handle in amdsmi.amdsmi_get_processor_handles():
            asic = amdsmi.amdsmi_get_gpu_asic_info(handle)
            arch = gfx_arch_name(asic.get("target_graphics_version"))
            memory = memory_bytes(
                int(amdsmi.amdsmi_get_gpu_memory_total(handle, amdsmi.AmdSmiMemoryType.VRAM)),
                "amdsmi",
            )
            name = str(asic.get("market_name") or _amd_name(None, arch or "", ""))
            info = DeviceInfo(
                name=name,
                total_memory=memory,
                capability=gfx_capability(arch),
                arch=arch,
                vendor="AMD",
            )
            logger.debug("amd: amdsmi device: %s %s", name, arch)
            found.append(Found(info))
        return found

    return query_library(AMDSMI, "the GPU list", query, fallback="the KFD topology")


def probe_amd(
    root: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    *,
    use_amdsmi: bool = True,
) -> list[DeviceInfo]:
    """AMD GPUs visible to this process; empty when there are none.

    Uses amdsmi when ``use_amdsmi``, it is importable and ``root`` is the real
    ``/``; otherwise (or on an amdsmi error) the KFD topology. Applies
    ``ROCR_VISIBLE_DEVICES`` (indices or ``GPU-`` UUIDs) first, then
    ``HIP_VISIBLE_DEVICES`` (or, when that is unset, ``CUDA_VISIBLE_DEVICES``)
    as indices into what remains, as the ROCm runtime does.
    """
    root_path, env_map = resolve_root(root), resolve_env(env)
    gpus = _amdsmi_gpus() if use_amdsmi and is_host_root(root_path) else None
    if gpus is None:
        gpus = _kfd_gpus(root_path)
    visible = apply_visibility(
        gpus, env_map, "ROCR_VISIBLE_DEVICES", uuid_resolver([g.uuid for g in gpus])
    )
    hip_var = "HIP_VISIBLE_DEVICES" if "HIP_VISIBLE_DEVICES" in env_map else "CUDA_VISIBLE_DEVICES"
    visible = apply_visibility(visible, env_map, hip_var, uuid_resolver([g.uuid for g in visible]))
    logger.debug("amd: %d GPU(s) found, %d visible", len(gpus), len(visible))
    return [g.info for g in visible]
