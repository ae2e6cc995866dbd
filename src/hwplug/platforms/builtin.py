"""Where the shared platform base used to live: re-exports :mod:`hwplug.platforms.vendor`.

``BuiltinPlatform`` is the old name of :class:`~hwplug.platforms.vendor.VendorPlatform`.
New code imports from :mod:`hwplug.platforms.vendor`.
"""

from __future__ import annotations

from hwplug.platforms.vendor import DeviceQuery, VendorPlatform, VendorRuntime

BuiltinPlatform = VendorPlatform

__all__ = ["BuiltinPlatform", "DeviceQuery", "VendorPlatform", "VendorRuntime"]
