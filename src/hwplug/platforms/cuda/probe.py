"""Finding NVIDIA GPUs without torch: NVML, else sysfs and procfs, else Jetson markers.

NVML (``pynvml`` from nvidia-ml-py) knows names, memory, compute capability
and UUIDs exactly. Without it, PCI functions with vendor ``0x10de`` and a
display class are read from ``/sys/bus/pci/devices``, named from
``/proc/driver/nvidia/gpus/<address>/information`` and completed from a table
of known PCI device ids. Jetson modules have no PCI GPU:
``/etc/nv_tegra_release`` or ``/sys/class/tegra-firmware`` marks the
integrated GPU, named from ``/proc/device-tree/model``.
``CUDA_VISIBLE_DEVICES`` (indices or ``GPU-`` UUIDs) applies.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hwplug.core.platform import DeviceCapability, DeviceInfo
from hwplug.platforms.cuda.profiles import PROFILES
from hwplug.platforms.sysfs import (
    NVML,
    Found,
    apply_visibility,
    exists,
    is_host_root,
    library_text,
    meminfo_total,
    memory_bytes,
    pci_functions,
    query_library,
    read_fields,
    read_text,
    resolve_env,
    resolve_root,
    uuid_resolver,
)

__all__ = ["NVIDIA_VENDOR_ID", "probe_nvidia"]

logger = logging.getLogger("hwplug.probes")


NVIDIA_VENDOR_ID = 0x10DE

_NVIDIA_EXTRA_PCI_IDS: dict[int, tuple[str, tuple[int, int]]] = {
    0x20B0: ("NVIDIA A100-SXM4-40GB", (8, 0)),
    0x20B5: ("NVIDIA A100 80GB PCIe", (8, 0)),
    0x20F1: ("NVIDIA A100-PCIE-40GB", (8, 0)),
    0x2236: ("NVIDIA A10", (8, 6)),
    0x2321: ("NVIDIA H100 NVL", (9, 0)),
    0x2331: ("NVIDIA H100 PCIe", (9, 0)),
    0x26B9: ("NVIDIA L40S", (8, 9)),
    0x2684: ("NVIDIA GeForce RTX 4090", (8, 9)),
    0x1DB1: ("Tesla V100-SXM2-16GB", (7, 0)),
    0x1DB5: ("Tesla V100-SXM2-32GB", (7, 0)),
}

# PCI device ids of the profiled parts: the sysfs view of these is exact.
_NVIDIA_PROFILE_PCI_IDS: dict[int, str] = {
    0x2901: "b200",
    0x2330: "h100",
    0x2335: "h200",
    0x20B2: "a100",
    0x27B8: "l4",
    0x2204: "rtx3090",
    0x1EB8: "t4",
}


def _nvidia_known(device_id: int) -> DeviceInfo | None:
    profile = _NVIDIA_PROFILE_PCI_IDS.get(device_id)
    if profile is not None:
        return PROFILES[profile]
    extra = _NVIDIA_EXTRA_PCI_IDS.get(device_id)
    if extra is not None:
        return DeviceInfo(
            name=extra[0], capability=DeviceCapability.parse(extra[1]), vendor="NVIDIA"
        )
    return None


# Compute capability of Jetson modules, by the model name's family.
_JETSON_CAPABILITY = (
    ("thor", (11, 0)),
    ("orin", (8, 7)),
    ("xavier", (7, 2)),
    ("tx2", (6, 2)),
    ("nano", (5, 3)),
    ("tx1", (5, 3)),
)


def _nvml_gpus() -> list[Found] | None:
    """Every GPU NVML reports, or None when NVML is absent or fails."""

    def query(pynvml: Any) -> list[Found]:
        found = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = library_text(pynvml.nvmlDeviceGetName(handle))
            memory = memory_bytes(int(pynvml.nvmlDeviceGetMemoryInfo(handle).total), "NVML")
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            try:
                uuid: str | None = library_text(pynvml.nvmlDeviceGetUUID(handle))
            except pynvml.NVMLError:
                uuid = None
            info = DeviceInfo(
                name=name,
                total_memory=memory,
                capability=DeviceCapability.parse((int(major), int(minor))),
                vendor="NVIDIA",
            )
            logger.debug("nvidia: NVML device %d: %s (%s)", index, name, uuid)
            found.append(Found(info, uuid))
        return found

    return query_library(NVML, "the GPU list", query, fallback="sysfs")


def _nvidia_sysfs_gpus(root: Path) -> list[Found]:
    found = []
    for fn in pci_functions(root, NVIDIA_VENDOR_ID):
        if not fn.is_display:
            logger.debug("nvidia: pci %s class %#08x is not a GPU", fn.address, fn.pci_class)
            continue
        if fn.driver is not None and fn.driver != "nvidia":
            logger.debug(
                "nvidia: pci %s is bound to %s, not nvidia; skipped", fn.address, fn.driver
            )
            continue
        fields = read_fields(root / "proc/driver/nvidia/gpus" / fn.address / "information")
        known = _nvidia_known(fn.device)
        name = fields.get("model") or (
            known.name if known else f"NVIDIA GPU [10de:{fn.device:04x}]"
        )
        info = DeviceInfo(
            name=name,
            total_memory=known.total_memory if known else 0,
            capability=known.capability if known else None,
            vendor="NVIDIA",
        )
        logger.debug("nvidia: pci %s device %#06x: %s", fn.address, fn.device, name)
        found.append(Found(info, fields.get("gpu uuid") or None))
    return found


def _jetson_gpu(root: Path) -> Found | None:
    markers = (root / "etc/nv_tegra_release", root / "sys/class/tegra-firmware")
    if not any(exists(marker) for marker in markers):
        return None
    model = (read_text(root / "proc/device-tree/model") or "").replace("\x00", "").strip()
    name = model or "NVIDIA Jetson"
    lowered = name.lower()
    known = next((cap for key, cap in _JETSON_CAPABILITY if key in lowered), None)
    capability = DeviceCapability.parse(known) if known else None
    logger.debug("nvidia: Jetson integrated GPU: %s", name)
    # The integrated GPU shares system memory.
    info = DeviceInfo(
        name=name, total_memory=meminfo_total(root), capability=capability, vendor="NVIDIA"
    )
    return Found(info)


def probe_nvidia(
    root: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    *,
    use_nvml: bool = True,
) -> list[DeviceInfo]:
    """NVIDIA GPUs visible to this process; empty when there are none.

    Uses NVML when ``use_nvml``, ``pynvml`` is importable and ``root`` is the
    real ``/``; an NVML error falls back to the sysfs/procfs view. Honours
    ``CUDA_VISIBLE_DEVICES`` (indices or ``GPU-`` UUIDs). Never initialises
    the CUDA runtime.
    """
    root_path, env_map = resolve_root(root), resolve_env(env)
    gpus = _nvml_gpus() if use_nvml and is_host_root(root_path) else None
    if gpus is None:
        gpus = _nvidia_sysfs_gpus(root_path)
    if not gpus:
        jetson = _jetson_gpu(root_path)
        gpus = [jetson] if jetson else []
    visible = apply_visibility(
        gpus, env_map, "CUDA_VISIBLE_DEVICES", uuid_resolver([g.uuid for g in gpus])
    )
    logger.debug("nvidia: %d GPU(s) found, %d visible", len(gpus), len(visible))
    return [g.info for g in visible]
