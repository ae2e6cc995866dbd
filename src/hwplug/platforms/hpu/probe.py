"""Finding Intel Gaudi accelerators without torch: PCI vendor ``0x1da3`` in sysfs.

The generation comes from the PCI device id; the habanalabs driver's
``/dev/accel/accel*`` (or older ``/dev/hl*``) nodes must exist.
``HABANA_VISIBLE_MODULES`` (module ids) applies.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from hwplug.core.platform import DeviceInfo
from hwplug.platforms.hpu.profiles import PROFILES
from hwplug.platforms.sysfs import (
    Found,
    PciFunction,
    apply_visibility,
    decimal,
    exists,
    numbered,
    pci_functions,
    read_int,
    resolve_env,
    resolve_root,
)

__all__ = ["HABANA_VENDOR_ID", "probe_habana"]

logger = logging.getLogger("hwplug.probes")


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


def _habana_module_id(fn: PciFunction) -> int | None:
    candidates = [fn.path / "module_id"]
    candidates += [p / "module_id" for _, p in numbered(fn.path / "accel", "accel")]
    candidates += [p / "module_id" for _, p in numbered(fn.path / "habanalabs", "hl")]
    for path in candidates:
        if exists(path):
            value = read_int(path)
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
    root_path, env_map = resolve_root(root), resolve_env(env)
    dev_nodes = numbered(root_path / "dev/accel", "accel") + numbered(root_path / "dev", "hl")
    found: list[Found] = []
    for fn in pci_functions(root_path, HABANA_VENDOR_ID):
        arch = _HABANA_GENERATIONS.get(fn.device)
        if arch is None:
            logger.debug("habana: pci %s device %#06x is not a Gaudi", fn.address, fn.device)
            continue
        profile = PROFILES[arch]
        module_id = _habana_module_id(fn)
        if module_id is None:
            module_id = len(found)
        logger.debug("habana: pci %s: %s, module %d", fn.address, profile.name, module_id)
        found.append(Found(profile, extra={"module_id": module_id}))
    if found and not dev_nodes:
        logger.debug("habana: %d Gaudi(s) on PCI but no driver device nodes", len(found))
        return []
    modules: list[int] = [g.extra["module_id"] for g in found]
    visible = apply_visibility(
        found,
        env_map,
        "HABANA_VISIBLE_MODULES",
        lambda entry: (
            modules.index(number)
            if (number := decimal(entry)) is not None and number in modules
            else None
        ),
    )
    logger.debug("habana: %d device(s) found, %d visible", len(found), len(visible))
    return [g.info for g in visible]
