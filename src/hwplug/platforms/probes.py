"""Hardware probes that read the operating system and never import torch.

Each probe answers "which devices of this kind does this process see?" from
what the kernel publishes, so that platform detection costs a few file reads,
initialises no device runtime and leaves a later ``fork`` safe. Vendor
management libraries (NVML, amdsmi) are used when installed, because they
know names, memory and capability exactly; they talk to the kernel driver,
not to the CUDA/HIP runtime.

Every probe takes a filesystem ``root`` (default: ``$HWPLUG_PROBE_ROOT`` or
``/``) under which it reads ``sys``, ``proc``, ``dev`` and ``etc``, so tests
build fake trees for each vendor, and an ``env`` mapping (default:
``os.environ``) for the visibility variables. Vendor libraries are consulted
only when ``root`` is the real ``/``. A missing, unreadable or malformed file
makes a probe skip what it describes (logged at debug level on the
``hwplug.probes`` logger); a probe never raises for the state of the machine.

Sources, per probe:

NVIDIA (:func:`probe_nvidia`)
    NVML (``pynvml`` from nvidia-ml-py): name, memory, compute capability and
    UUID of every GPU. Without it, PCI functions in ``/sys/bus/pci/devices``
    with vendor ``0x10de`` and a display class (``0x03xxxx``), named from
    ``/proc/driver/nvidia/gpus/<address>/information`` ("Model:", "GPU UUID:")
    and completed from a table of known PCI device ids. Jetson modules have
    no PCI GPU: ``/etc/nv_tegra_release`` or ``/sys/class/tegra-firmware``
    marks the integrated GPU, named from ``/proc/device-tree/model``.
    ``CUDA_VISIBLE_DEVICES`` applies.
AMD (:func:`probe_amd`)
    amdsmi, else the KFD topology ``/sys/class/kfd/kfd/topology/nodes/*``:
    ``properties`` (``gfx_target_version`` is 0 on CPU nodes), memory banks
    and ``name``. ``ROCR_VISIBLE_DEVICES`` then ``HIP_VISIBLE_DEVICES`` (or
    ``CUDA_VISIBLE_DEVICES``, which HIP also reads) apply.
Intel Gaudi (:func:`probe_habana`)
    PCI vendor ``0x1da3``, generation from the device id; the habanalabs
    driver's ``/dev/accel/accel*`` (or older ``/dev/hl*``) nodes must exist.
    ``HABANA_VISIBLE_MODULES`` (module ids) applies.
Intel GPU (:func:`probe_intel_gpu`)
    PCI vendor ``0x8086`` display devices bound to ``xe`` or ``i915`` that
    have device-local memory; integrated GPUs never count.
    ``ZE_AFFINITY_MASK`` applies.
CPU (:func:`probe_cpu`, :func:`cpu_numa_nodes`)
    ``/proc/cpuinfo`` for the model and ISA flags, psutil (or
    ``/proc/meminfo``) for memory, ``/sys/devices/system/node`` for NUMA
    nodes (``CPU_VISIBLE_MEMORY_NODES`` applies).

Visibility variables follow the CUDA convention: unset means all devices; an
empty value (or ``-1``) means none, except for ``ZE_AFFINITY_MASK`` and
``CPU_VISIBLE_MEMORY_NODES``, where empty means all; entries are taken in
order and an invalid entry (unknown index or id, or a repeat) ends the list
there.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import platform as _platform
import re
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from hwplug.core.platform import MAX_MEMORY, DeviceCapability, DeviceInfo
from hwplug.platforms.profiles import PROFILES

__all__ = [
    "PROBE_ROOT_ENV",
    "cpu_numa_nodes",
    "ipex_available",
    "probe_amd",
    "probe_cpu",
    "probe_habana",
    "probe_intel_gpu",
    "probe_nvidia",
]

logger = logging.getLogger("hwplug.probes")

PROBE_ROOT_ENV = "HWPLUG_PROBE_ROOT"
"""Environment variable naming the filesystem root probes read (default ``/``)."""

GiB = 1 << 30

_T = TypeVar("_T")

# ---------------------------------------------------------------------------
# Reading the filesystem
# ---------------------------------------------------------------------------


def _resolve_root(root: str | os.PathLike[str] | None) -> Path:
    if root is None:
        root = os.environ.get(PROBE_ROOT_ENV) or "/"
    return Path(root)


def _resolve_env(env: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if env is None else env


def _is_host_root(root: Path) -> bool:
    """Whether ``root`` is the real ``/`` (vendor libraries describe only that)."""
    try:
        return root.resolve() == Path(os.sep).resolve()
    except (OSError, RuntimeError):
        return False


def _exists(path: Path) -> bool:
    # os.path.exists, unlike Path.exists, never raises (a permission error is False).
    return os.path.exists(path)


# Every read is bounded: sysfs attributes hold at most a page, /proc/cpuinfo
# of a large host a few hundred KiB.
_READ_LIMIT = 1 << 20
_MAX_DIGITS = 40


def _read_text(path: Path) -> str | None:
    """The first MiB of a regular file, or None (missing, unreadable, or not a regular
    file: a device node or FIFO linked into the tree is never read)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        logger.debug("cannot read %s: %s", path, exc.strerror or exc)
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            logger.debug("%s is not a regular file; not read", path)
            return None
        with os.fdopen(fd, "rb", closefd=False) as stream:
            data = stream.read(_READ_LIMIT)
    except OSError as exc:
        logger.debug("cannot read %s: %s", path, exc.strerror or exc)
        return None
    finally:
        os.close(fd)
    return data.decode("utf-8", errors="replace")


def _bytes(value: int, what: object) -> int:
    """A memory figure as reported, or 0 (unknown) when it is beyond 2**60 bytes."""
    if 0 <= value <= MAX_MEMORY:
        return value
    logger.debug("%s: memory figure %d is out of range; treated as unknown", what, value)
    return 0


def _decimal(text: str) -> int | None:
    """A non-negative ASCII decimal of at most 40 digits, else None (``²`` is not one)."""
    text = text.strip()
    if text and len(text) <= _MAX_DIGITS and text.isascii() and text.isdecimal():
        return int(text)
    return None


def _parse_uint(text: str) -> int | None:
    """A non-negative decimal (``206158430208``) or hex (``0x10de``) number, else None.

    Every number the probes read (ids, classes, sizes) is non-negative.
    """
    text = text.strip()
    value = _decimal(text)
    if value is not None:
        return value
    digits = text[2:]
    if (
        text[:2].lower() == "0x"
        and 0 < len(digits) <= _MAX_DIGITS
        and all(c in "0123456789abcdefABCDEF" for c in digits)
    ):
        return int(digits, 16)
    return None


def _read_int(path: Path) -> int | None:
    """An integer file such as sysfs ``vendor`` (``0x10de``) or a decimal size."""
    text = _read_text(path)
    if text is None:
        return None
    value = _parse_uint(text)
    if value is None:
        logger.debug("%s does not hold a non-negative integer: %r", path, text[:40])
    return value


def _read_properties(path: Path) -> dict[str, str]:
    """``key value`` lines, as in the KFD topology ``properties`` files."""
    text = _read_text(path)
    if text is None:
        return {}
    props: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        if key:
            props[key] = value.strip()
    return props


def _read_fields(path: Path) -> dict[str, str]:
    """``Key: value`` lines, as in ``/proc/driver/nvidia/gpus/*/information``."""
    text = _read_text(path)
    if text is None:
        return {}
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip().lower()] = value.strip()
    return fields


def _prop_int(props: Mapping[str, str], key: str) -> int | None:
    text = props.get(key)
    if text is None:
        return None
    value = _parse_uint(text)
    if value is None:
        logger.debug("property %s is not a non-negative integer: %r", key, text)
    return value


def _list_dir(path: Path) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def _numbered(path: Path, prefix: str) -> list[tuple[int, Path]]:
    """Entries ``<prefix><n>`` of a directory, sorted by ``n``."""
    found = []
    for name in _list_dir(path):
        number = _decimal(name[len(prefix) :]) if name.startswith(prefix) else None
        if number is not None:
            found.append((number, path / name))
    return sorted(found)


def _meminfo_total(root: Path) -> int:
    """``MemTotal`` of ``/proc/meminfo`` in bytes, 0 when unknown."""
    fields = _read_fields(root / "proc/meminfo")
    value = fields.get("memtotal", "")
    text, _, unit = value.partition(" ")
    number = _decimal(text)
    if number is None:
        return 0
    return _bytes(number * (1024 if unit.strip().lower() == "kb" else 1), "MemTotal")


@dataclass(frozen=True)
class _PciFunction:
    address: str
    path: Path
    vendor: int
    device: int
    pci_class: int
    driver: str | None

    @property
    def is_display(self) -> bool:
        return self.pci_class >> 16 == 0x03


def _pci_functions(root: Path, vendor: int) -> list[_PciFunction]:
    """PCI functions of ``vendor`` in ``/sys/bus/pci/devices``, in bus order."""
    base = root / "sys/bus/pci/devices"
    found = []
    for address in _list_dir(base):
        path = base / address
        if _read_int(path / "vendor") != vendor:
            continue
        device = _read_int(path / "device")
        pci_class = _read_int(path / "class")
        if device is None or pci_class is None:
            logger.debug("pci %s: no readable device id or class; skipped", address)
            continue
        try:
            driver: str | None = os.path.basename(os.readlink(path / "driver"))
        except OSError:
            driver = None
        found.append(_PciFunction(address, path, vendor, device, pci_class, driver))
    return found


# ---------------------------------------------------------------------------
# Visibility variables
# ---------------------------------------------------------------------------


def _apply_visibility(
    devices: Sequence[_T],
    env: Mapping[str, str],
    var: str,
    resolve: Callable[[str], int | None],
    *,
    empty_means_all: bool = False,
    collapse_repeats: bool = False,
) -> list[_T]:
    """The devices ``env[var]`` selects, in the order it lists them.

    ``resolve`` maps one entry to an index into ``devices`` (None: invalid).
    Unset selects everything; empty selects nothing unless
    ``empty_means_all``. An invalid entry, or a repeated device unless
    ``collapse_repeats``, ends the list there, as the CUDA driver does.
    """
    value = env.get(var)
    if value is None:
        return list(devices)
    if not value.strip():
        if empty_means_all:
            return list(devices)
        logger.debug("%s is empty: no device visible", var)
        return []
    chosen: list[int] = []
    for entry in (part.strip() for part in value.split(",")):
        index = resolve(entry) if entry else None
        if index is None or not 0 <= index < len(devices):
            logger.debug("%s=%r: entry %r is not a visible device; list ends", var, value, entry)
            break
        if index in chosen:
            if collapse_repeats:
                continue
            logger.debug("%s=%r: entry %r repeats a device; list ends", var, value, entry)
            break
        chosen.append(index)
    return [devices[i] for i in chosen]


def _uuid_resolver(uuids: Sequence[str | None]) -> Callable[[str], int | None]:
    """Resolve an index, or a full or unique-prefix UUID (case-insensitive)."""

    def resolve(entry: str) -> int | None:
        index = _decimal(entry)
        if index is not None:
            return index
        wanted = entry.lower()
        matches = [i for i, uuid in enumerate(uuids) if uuid and uuid.lower().startswith(wanted)]
        return matches[0] if len(matches) == 1 else None

    return resolve


# ---------------------------------------------------------------------------
# NVIDIA
# ---------------------------------------------------------------------------

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
        return PROFILES["cuda"][profile]
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


@dataclass(frozen=True)
class _Found:
    """A detected device plus what visibility variables match on."""

    info: DeviceInfo
    uuid: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def library_text(value: object) -> str:
    """A string from a vendor library, which may return bytes (older pynvml releases)."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _nvml_gpus() -> list[_Found] | None:
    """Every GPU NVML reports, or None when NVML is absent or fails."""
    try:
        pynvml = importlib.import_module("pynvml")
    except ImportError:
        logger.debug("nvidia: pynvml is not installed; using sysfs")
        return None
    nvml_error: type[BaseException] = pynvml.NVMLError
    try:
        pynvml.nvmlInit()
    except nvml_error as exc:
        logger.debug("nvidia: NVML unavailable (%s); using sysfs", exc)
        return None
    try:
        found = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = library_text(pynvml.nvmlDeviceGetName(handle))
            memory = _bytes(int(pynvml.nvmlDeviceGetMemoryInfo(handle).total), "NVML")
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            try:
                uuid: str | None = library_text(pynvml.nvmlDeviceGetUUID(handle))
            except nvml_error:
                uuid = None
            info = DeviceInfo(
                name=name,
                total_memory=memory,
                capability=DeviceCapability.parse((int(major), int(minor))),
                vendor="NVIDIA",
            )
            logger.debug("nvidia: NVML device %d: %s (%s)", index, name, uuid)
            found.append(_Found(info, uuid))
        return found
    except nvml_error as exc:
        logger.debug("nvidia: NVML query failed (%s); using sysfs", exc)
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except nvml_error as exc:
            logger.debug("nvidia: nvmlShutdown failed: %s", exc)


def _nvidia_sysfs_gpus(root: Path) -> list[_Found]:
    found = []
    for fn in _pci_functions(root, NVIDIA_VENDOR_ID):
        if not fn.is_display:
            logger.debug("nvidia: pci %s class %#08x is not a GPU", fn.address, fn.pci_class)
            continue
        if fn.driver is not None and fn.driver != "nvidia":
            logger.debug(
                "nvidia: pci %s is bound to %s, not nvidia; skipped", fn.address, fn.driver
            )
            continue
        fields = _read_fields(root / "proc/driver/nvidia/gpus" / fn.address / "information")
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
        found.append(_Found(info, fields.get("gpu uuid") or None))
    return found


def _jetson_gpu(root: Path) -> _Found | None:
    markers = (root / "etc/nv_tegra_release", root / "sys/class/tegra-firmware")
    if not any(_exists(marker) for marker in markers):
        return None
    model = (_read_text(root / "proc/device-tree/model") or "").replace("\x00", "").strip()
    name = model or "NVIDIA Jetson"
    lowered = name.lower()
    known = next((cap for key, cap in _JETSON_CAPABILITY if key in lowered), None)
    capability = DeviceCapability.parse(known) if known else None
    logger.debug("nvidia: Jetson integrated GPU: %s", name)
    # The integrated GPU shares system memory.
    info = DeviceInfo(
        name=name, total_memory=_meminfo_total(root), capability=capability, vendor="NVIDIA"
    )
    return _Found(info)


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
    root_path, env_map = _resolve_root(root), _resolve_env(env)
    gpus = _nvml_gpus() if use_nvml and _is_host_root(root_path) else None
    if gpus is None:
        gpus = _nvidia_sysfs_gpus(root_path)
    if not gpus:
        jetson = _jetson_gpu(root_path)
        gpus = [jetson] if jetson else []
    visible = _apply_visibility(
        gpus, env_map, "CUDA_VISIBLE_DEVICES", _uuid_resolver([g.uuid for g in gpus])
    )
    logger.debug("nvidia: %d GPU(s) found, %d visible", len(gpus), len(visible))
    return [g.info for g in visible]


# ---------------------------------------------------------------------------
# AMD
# ---------------------------------------------------------------------------

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


def _gfx_arch(version: int) -> tuple[str, DeviceCapability]:
    """Decode KFD's ``gfx_target_version`` (90402 -> ``gfx942``, capability 9.4)."""
    major, minor, stepping = version // 10000, version // 100 % 100, version % 100
    return f"gfx{major}{minor:x}{stepping:x}", DeviceCapability.parse((major, minor))


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
    for _, bank in _numbered(node / "mem_banks", ""):
        props = _read_properties(bank / "properties")
        size = _prop_int(props, "size_in_bytes") or 0
        heap = _prop_int(props, "heap_type")
        total += size
        if heap is not None:
            saw_heap_type = True
            if heap in _KFD_LOCAL_HEAPS:
                local += size
    return local if saw_heap_type else total


def _kfd_gpus(root: Path) -> list[_Found]:
    found = []
    for index, node in _numbered(root / "sys/class/kfd/kfd/topology/nodes", ""):
        props = _read_properties(node / "properties")
        version = _prop_int(props, "gfx_target_version")
        if not version:
            logger.debug("amd: KFD node %d has no gfx_target_version (a CPU node)", index)
            continue
        arch, capability = _gfx_arch(version)
        asic = (_read_text(node / "name") or "").strip()
        name = _amd_name(_prop_int(props, "device_id"), arch, asic)
        unique_id = _prop_int(props, "unique_id")
        info = DeviceInfo(
            name=name,
            total_memory=_bytes(_kfd_memory(node), node),
            capability=capability,
            arch=arch,
            vendor="AMD",
        )
        logger.debug("amd: KFD node %d: %s %s", index, name, arch)
        # ROCr names a GPU "GPU-<unique_id as 16 hex digits>".
        uuid = f"GPU-{unique_id:016x}" if unique_id else None
        found.append(_Found(info, uuid))
    return found


def _amdsmi_gpus() -> list[_Found] | None:
    """Every GPU amdsmi reports, or None when amdsmi is absent or fails."""
    try:
        amdsmi = importlib.import_module("amdsmi")
    except ImportError:
        logger.debug("amd: amdsmi is not installed; using the KFD topology")
        return None
    smi_error: type[BaseException] = amdsmi.AmdSmiException
    try:
        amdsmi.amdsmi_init()
    except smi_error as exc:
        logger.debug("amd: amdsmi unavailable (%s); using the KFD topology", exc)
        return None
    try:
        found = []
        for handle in amdsmi.amdsmi_get_processor_handles():
            asic = amdsmi.amdsmi_get_gpu_asic_info(handle)
            target = asic.get("target_graphics_version")
            arch: str | None = None
            capability: DeviceCapability | None = None
            if isinstance(target, str) and target.startswith("gfx"):
                arch = target
                digits = target[3:]
                major = _decimal(digits[:-2]) if len(digits) >= 3 else None
                if major is not None and digits[-2] in "0123456789abcdef":
                    capability = DeviceCapability.parse((major, int(digits[-2], 16)))
            elif isinstance(target, int) and target > 0:
                arch, capability = _gfx_arch(target)
            memory = _bytes(
                int(amdsmi.amdsmi_get_gpu_memory_total(handle, amdsmi.AmdSmiMemoryType.VRAM)),
                "amdsmi",
            )
            name = str(asic.get("market_name") or _amd_name(None, arch or "", ""))
            info = DeviceInfo(
                name=name, total_memory=memory, capability=capability, arch=arch, vendor="AMD"
            )
            logger.debug("amd: amdsmi device: %s %s", name, arch)
            found.append(_Found(info))
        return found
    except smi_error as exc:
        logger.debug("amd: amdsmi query failed (%s); using the KFD topology", exc)
        return None
    finally:
        try:
            amdsmi.amdsmi_shut_down()
        except smi_error as exc:
            logger.debug("amd: amdsmi_shut_down failed: %s", exc)


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
    root_path, env_map = _resolve_root(root), _resolve_env(env)
    gpus = _amdsmi_gpus() if use_amdsmi and _is_host_root(root_path) else None
    if gpus is None:
        gpus = _kfd_gpus(root_path)
    visible = _apply_visibility(
        gpus, env_map, "ROCR_VISIBLE_DEVICES", _uuid_resolver([g.uuid for g in gpus])
    )
    hip_var = "HIP_VISIBLE_DEVICES" if "HIP_VISIBLE_DEVICES" in env_map else "CUDA_VISIBLE_DEVICES"
    visible = _apply_visibility(
        visible, env_map, hip_var, _uuid_resolver([g.uuid for g in visible])
    )
    logger.debug("amd: %d GPU(s) found, %d visible", len(gpus), len(visible))
    return [g.info for g in visible]


# ---------------------------------------------------------------------------
# Intel Gaudi (Habana Labs)
# ---------------------------------------------------------------------------

HABANA_VENDOR_ID = 0x1DA3

# PCI device ids of the habanalabs driver (secured, HL-2000M, HL-288/HL-338 and
# single-die variants included); Goya and Greco are inference parts hwplug
# does not run on.
_HABANA_GENERATIONS: dict[int, str] = {
    0x1000: "gaudi",
    0x1001: "gaudi",
    0x1010: "gaudi",
    0x1011: "gaudi",
    0x1020: "gaudi2",
    0x1021: "gaudi2",
    0x1030: "gaudi2",
    0x1060: "gaudi3",
    0x1061: "gaudi3",
    0x1062: "gaudi3",
    0x1063: "gaudi3",
}


def _habana_module_id(fn: _PciFunction) -> int | None:
    candidates = [fn.path / "module_id"]
    candidates += [p / "module_id" for _, p in _numbered(fn.path / "accel", "accel")]
    candidates += [p / "module_id" for _, p in _numbered(fn.path / "habanalabs", "hl")]
    for path in candidates:
        if _exists(path):
            value = _read_int(path)
            if value is not None:
                return value
    return None


def probe_habana(
    root: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
) -> list[DeviceInfo]:
    """Intel Gaudi accelerators visible to this process; empty when there are none.

    A device counts when its PCI function is present and the habanalabs
    driver has created its device nodes (``/dev/accel/accel*`` or
    ``/dev/hl*``). ``HABANA_VISIBLE_MODULES`` selects by module id (the
    ``module_id`` the driver publishes; the bus order when it does not).
    """
    root_path, env_map = _resolve_root(root), _resolve_env(env)
    dev_nodes = _numbered(root_path / "dev/accel", "accel") + _numbered(root_path / "dev", "hl")
    found: list[_Found] = []
    for fn in _pci_functions(root_path, HABANA_VENDOR_ID):
        arch = _HABANA_GENERATIONS.get(fn.device)
        if arch is None:
            logger.debug("habana: pci %s device %#06x is not a Gaudi", fn.address, fn.device)
            continue
        profile = PROFILES["hpu"][arch]
        module_id = _habana_module_id(fn)
        if module_id is None:
            module_id = len(found)
        logger.debug("habana: pci %s: %s, module %d", fn.address, profile.name, module_id)
        found.append(_Found(profile, extra={"module_id": module_id}))
    if found and not dev_nodes:
        logger.debug("habana: %d Gaudi(s) on PCI but no driver device nodes", len(found))
        return []
    modules: list[int] = [g.extra["module_id"] for g in found]
    visible = _apply_visibility(
        found,
        env_map,
        "HABANA_VISIBLE_MODULES",
        lambda entry: (
            modules.index(number)
            if (number := _decimal(entry)) is not None and number in modules
            else None
        ),
    )
    logger.debug("habana: %d device(s) found, %d visible", len(found), len(visible))
    return [g.info for g in visible]


# ---------------------------------------------------------------------------
# Intel GPUs (discrete only)
# ---------------------------------------------------------------------------

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
    0x0BD5: PROFILES["xpu"]["max-1550"].name,
    0x0BDA: "Intel(R) Data Center GPU Max 1100",
    0x56A0: PROFILES["xpu"]["arc-a770"].name,
    0x56A1: "Intel(R) Arc(TM) A750 Graphics",
    0x56A5: "Intel(R) Arc(TM) A380 Graphics",
    0x56C0: "Intel(R) Data Center GPU Flex 170",
    0x56C1: "Intel(R) Data Center GPU Flex 140",
    0xE20B: PROFILES["xpu"]["arc-b580"].name,
}


def _intel_family(device_id: int) -> str | None:
    return next((arch for arch, ids in _INTEL_DISCRETE_FAMILIES if device_id in ids), None)


def _intel_local_memory(fn: _PciFunction) -> int:
    """Device-local memory in bytes as the kernel driver publishes it, 0 if none.

    xe creates ``tile<N>/physical_vram_size_bytes`` under the PCI device only
    on discrete parts (newer kernels: ``tile<N>/memory/``); the i915 backport
    that drives Data Center GPUs publishes ``drm/card<N>/lmem_total_bytes``.
    Integrated GPUs publish neither. Upstream i915 publishes no such file,
    so a known discrete device id also counts (with memory unknown).
    """
    total = 0
    for _, tile in _numbered(fn.path, "tile"):
        for path in (tile / "physical_vram_size_bytes", tile / "memory/physical_vram_size_bytes"):
            value = _read_int(path) if _exists(path) else None
            if value:
                total += value
                break
    if total:
        return total
    for _, card in _numbered(fn.path / "drm", "card"):
        lmem = card / "lmem_total_bytes"
        value = _read_int(lmem) if _exists(lmem) else None
        if value:
            return value
    return 0


def _intel_affinity_resolver(entry: str) -> int | None:
    # "N" is device N; "N.M" is sub-device (tile) M of device N, which
    # selects device N here (hwplug counts cards, not tiles).
    card, dot, tile = entry.partition(".")
    if dot and _decimal(tile) is None:
        return None
    return _decimal(card)


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
    root_path, env_map = _resolve_root(root), _resolve_env(env)
    found: list[_Found] = []
    for fn in _pci_functions(root_path, INTEL_VENDOR_ID):
        if not fn.is_display:
            continue
        if fn.driver not in _INTEL_GPU_DRIVERS:
            logger.debug(
                "intel: pci %s is bound to %s, not xe/i915; skipped", fn.address, fn.driver
            )
            continue
        arch = _intel_family(fn.device)
        memory = _bytes(_intel_local_memory(fn), fn.address)
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
        found.append(_Found(info))
    visible = _apply_visibility(
        found,
        env_map,
        "ZE_AFFINITY_MASK",
        _intel_affinity_resolver,
        empty_means_all=True,
        collapse_repeats=True,
    )
    logger.debug("intel: %d discrete GPU(s) found, %d visible", len(found), len(visible))
    return [g.info for g in visible]


# ---------------------------------------------------------------------------
# CPU
# ---------------------------------------------------------------------------

_CPU_FEATURES = frozenset({"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"})

_CPU_VENDORS = {"GenuineIntel": "Intel", "AuthenticAMD": "AMD"}


def ipex_available() -> bool:
    """Whether ``intel_extension_for_pytorch`` is installed (it is not imported)."""
    try:
        return importlib.util.find_spec("intel_extension_for_pytorch") is not None
    except (ImportError, ValueError):
        return False


def _first_cpu_block(root: Path) -> dict[str, str]:
    text = _read_text(root / "proc/cpuinfo") or ""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip().lower(), value.strip())
    return fields


def probe_cpu(
    root: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
) -> DeviceInfo:
    """The host CPU: model name, ISA features and total memory.

    ``features`` holds the kernel's flag names among ``avx2``, ``avx512f``,
    ``avx512_bf16``, ``amx_bf16``, ``amx_tile``, ``neon`` (Arm's ``asimd``),
    plus ``ipex`` when :func:`ipex_available`. Memory comes from psutil on the
    real root, else from ``/proc/meminfo``.
    """
    root_path = _resolve_root(root)
    host = _is_host_root(root_path)
    fields = _first_cpu_block(root_path)
    if "flags" in fields:
        arch: str | None = "x86_64"
        flags = set(fields["flags"].split())
    elif "features" in fields:
        arch = "aarch64"
        flags = set(fields["features"].split())
    else:
        arch = (_platform.machine() or None) if host else None
        flags = set()
    features = flags & _CPU_FEATURES
    if flags & {"asimd", "neon"}:
        features.add("neon")
    if ipex_available():
        features.add("ipex")
    name = fields.get("model name") or fields.get("model") or fields.get("hardware") or ""
    if not name or name.isdigit():
        name = f"{arch} CPU" if arch else "CPU"
    vendor = _CPU_VENDORS.get(fields.get("vendor_id", ""), fields.get("vendor_id", ""))
    memory = _host_memory() if host else 0
    if not memory:
        memory = _meminfo_total(root_path)
    logger.debug("cpu: %s, features %s, %d bytes", name, sorted(features), memory)
    return DeviceInfo(
        name=name, total_memory=memory, arch=arch, vendor=vendor, features=frozenset(features)
    )


def _host_memory() -> int:
    try:
        import psutil
    except ImportError:
        return 0
    return int(psutil.virtual_memory().total)


def _expand_node_ranges(value: str, highest: int) -> str:
    """``"0-2,5"`` -> ``"0,1,2,5"``; a malformed range stays as an invalid entry.

    A range is expanded no further than one past ``highest`` (the last node
    that exists), where the list would end anyway: ``0-99999999`` costs nothing.
    """
    parts: list[str] = []
    for part in value.split(","):
        match = re.fullmatch(r"\s*([0-9]{1,18})\s*-\s*([0-9]{1,18})\s*", part)
        if match and int(match.group(1)) <= int(match.group(2)):
            first = int(match.group(1))
            last = max(first, min(int(match.group(2)), highest + 1))
            parts.extend(str(n) for n in range(first, last + 1))
        else:
            parts.append(part)
    return ",".join(parts)


def cpu_numa_nodes(
    root: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
) -> list[int]:
    """NUMA memory nodes of ``/sys/devices/system/node``, in order of use.

    ``CPU_VISIBLE_MEMORY_NODES`` (``"0,1"``, ranges ``"0-3"``) selects and
    orders them; unset or empty means all. Empty when sysfs does not say.
    """
    root_path, env_map = _resolve_root(root), _resolve_env(env)
    nodes = [n for n, _ in _numbered(root_path / "sys/devices/system/node", "node")]
    var = "CPU_VISIBLE_MEMORY_NODES"
    view: Mapping[str, str] = env_map
    if env_map.get(var):
        view = {var: _expand_node_ranges(env_map[var], max(nodes, default=-1))}
    visible = _apply_visibility(
        nodes,
        view,
        var,
        lambda entry: (
            nodes.index(number) if (number := _decimal(entry)) is not None and number in nodes else None
        ),
        empty_means_all=True,
    )
    logger.debug("cpu: NUMA nodes %s, visible %s", nodes, visible)
    return visible
