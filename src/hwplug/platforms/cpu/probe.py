"""The host CPU without torch: ``/proc/cpuinfo``, psutil, NUMA nodes in sysfs.

``/proc/cpuinfo`` gives the model and ISA flags, psutil (or ``/proc/meminfo``)
the memory, ``/sys/devices/system/node`` the NUMA nodes
(``CPU_VISIBLE_MEMORY_NODES`` applies).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import platform as _platform
import re
from collections.abc import Mapping
from pathlib import Path

from hwplug.core.platform import DeviceInfo
from hwplug.platforms.sysfs import (
    apply_visibility,
    decimal,
    is_host_root,
    meminfo_total,
    numbered,
    read_text,
    resolve_env,
    resolve_root,
)

__all__ = ["cpu_numa_nodes", "ipex_available", "probe_cpu"]

logger = logging.getLogger("hwplug.probes")


_CPU_FEATURES = frozenset({"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"})

_CPU_VENDORS = {"GenuineIntel": "Intel", "AuthenticAMD": "AMD"}


def ipex_available() -> bool:
    """Whether ``intel_extension_for_pytorch`` is installed (it is not imported)."""
    try:
        return importlib.util.find_spec("intel_extension_for_pytorch") is not None
    except (ImportError, ValueError):
        return False


def _first_cpu_block(root: Path) -> dict[str, str]:
    text = read_text(root / "proc/cpuinfo") or ""
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
    root_path = resolve_root(root)
    host = is_host_root(root_path)
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
        memory = meminfo_total(root_path)
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
    root_path, env_map = resolve_root(root), resolve_env(env)
    nodes = [n for n, _ in numbered(root_path / "sys/devices/system/node", "node")]
    var = "CPU_VISIBLE_MEMORY_NODES"
    view: Mapping[str, str] = env_map
    if env_map.get(var):
        view = {var: _expand_node_ranges(env_map[var], max(nodes, default=-1))}
    visible = apply_visibility(
        nodes,
        view,
        var,
        lambda entry: (
            nodes.index(number)
            if (number := decimal(entry)) is not None and number in nodes
            else None
        ),
        empty_means_all=True,
    )
    logger.debug("cpu: NUMA nodes %s, visible %s", nodes, visible)
    return visible
