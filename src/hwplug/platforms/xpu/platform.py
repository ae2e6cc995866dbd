"""Intel discrete GPUs (XPU): Data Center GPU Max, Arc.

No device graphs: models run eagerly or through ``torch.compile``. fp8 KV
caches are stored as e5m2. Arc A-series (Alchemist) GPUs have no bfloat16.
The collective backend is ``xccl`` from torch 2.8 on, ``ccl`` before.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, ClassVar

from hwplug.core.errors import ConfigError
from hwplug.core.hookspecs import hookimpl
from hwplug.core.platform import DeviceInfo, Platform
from hwplug.core.versions import torch_version
from hwplug.platforms.vendor import VendorPlatform
from hwplug.platforms.xpu.probe import probe_intel_gpu
from hwplug.platforms.xpu.profiles import PROFILES

if TYPE_CHECKING:
    from hwplug.core.config import EngineConfig
    from hwplug.core.resolve import ChangeLog

__all__ = ["XpuPlatform", "hwplug_platforms", "xpu_dist_backend"]


def xpu_dist_backend() -> str:
    """``xccl`` (built into torch >= 2.8), else ``ccl`` (oneCCL bindings).

    Reads the installed torch version from package metadata; never imports torch.
    """
    version = torch_version()
    return "xccl" if version is not None and version >= (2, 8) else "ccl"


class XpuPlatform(VendorPlatform):
    """Intel discrete GPUs (xccl/ccl, ``ZE_AFFINITY_MASK``)."""

    name = "xpu"
    device_type = "xpu"
    dist_backend = xpu_dist_backend()
    priority = 10
    ray_device_key = "GPU"
    device_control_env_var = "ZE_AFFINITY_MASK"
    vendor = "Intel"

    block_sizes = (16, 32, 64)
    default_block = 64

    cache_dtypes = ("auto", "bfloat16", "fp8", "fp8_e5m2")
    fp8_format = "fp8_e5m2"
    """The format the ``fp8`` alias stands for."""
    fp8_dtype_name = "float8_e5m2"

    model_dtypes = ("bfloat16", "float16", "float32")
    no_bf16_names: ClassVar[re.Pattern[str]] = re.compile(
        r"\bArc(?:\(TM\))?\s+(?:Pro\s+)?A\d{2,3}\b", re.IGNORECASE
    )
    """Device names without bfloat16: the Arc A-series (Alchemist client GPUs)."""

    supports_device_graphs = False
    mla_without_chunked_prefill = True
    default_compilation_level = 3
    max_compilation_level = 3
    representative_profile = "max-1550"
    profile_table = PROFILES
    custom_op_forward = "forward_xpu"
    attention_order = ("triton", "torch")
    runs_triton = True
    pins_host_memory = True

    # -- discovery -----------------------------------------------------------
    @classmethod
    def detect(cls) -> list[DeviceInfo]:
        """Discrete Intel GPUs in sysfs (xe or i915 with device-local memory; no torch)."""
        return list(probe_intel_gpu())

    def device_id_to_physical_device_id(self, device_id: int) -> int:
        """As the base, but a ``ZE_AFFINITY_MASK`` tile entry ``N.M`` maps to card ``N``."""
        try:
            return super().device_id_to_physical_device_id(device_id)
        except ValueError:
            value = os.environ.get(self.device_control_env_var, "")
            entry = [p.strip() for p in value.split(",") if p.strip()][device_id]
            card, dot, tile = entry.partition(".")
            if dot and card.isdigit() and tile.isdigit():
                return int(card)
            raise

    def _has_bf16(self) -> bool:
        return not (self.devices and self.no_bf16_names.search(self.devices[0].name))

    # -- KV cache ------------------------------------------------------------------
    def device_cache_dtype_problem(self, cache_dtype: str) -> str | None:
        if cache_dtype == "fp8_e4m3":
            return f"Intel GPUs store fp8 KV caches only as {self.fp8_format}"
        if cache_dtype == "bfloat16" and not self._has_bf16():
            return "Arc A-series GPUs have no bfloat16"
        return None

    # -- model dtypes -----------------------------------------------------------------
    def bf16_problem(self) -> str | None:
        return None if self._has_bf16() else "Arc A-series GPUs have no bfloat16"

    # -- configuration ----------------------------------------------------------------
    def check_and_update_config(self, config: EngineConfig, changes: ChangeLog) -> None:
        """Block size 64, no Inductor compile sizes by default, executor ray/uni."""
        super().check_and_update_config(config, changes)
        if config.compilation.compile_sizes is None:
            changes.record(
                "compilation.compile_sizes", [], "no size-specialised compilation on xpu"
            )
        self.apply_mla_rules(config, changes)
        world = config.parallel.world_size
        executor = config.parallel.distributed_executor_backend
        if executor is None:
            chosen = "ray" if world > 1 else "uni"
            changes.record(
                "parallel.distributed_executor_backend",
                chosen,
                f"{world} rank(s) on xpu: {'Ray workers' if world > 1 else 'one process'}",
            )
        elif executor == "uni" and world > 1:
            raise ConfigError(
                f"parallel.distributed_executor_backend='uni' runs one process, but "
                f"parallel.world_size={world} on {self.describe_device()}; use "
                "parallel.distributed_executor_backend='ray' or 'mp'"
            )


@hookimpl
def hwplug_platforms() -> list[type[Platform]]:
    """The built-in Intel GPU platform."""
    return [XpuPlatform]
