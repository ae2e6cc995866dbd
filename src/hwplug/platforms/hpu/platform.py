"""Intel Gaudi accelerators (HPU).

Gaudi runs models in bfloat16, pages the KV cache in blocks of 128 or 256
tokens, stores fp8 KV caches only in the Intel Neural Compressor format
(``fp8_inc``, Gaudi 2 and later) and captures HPU graphs of the whole
forward pass, so piecewise compilation (level 3) is not available.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from hwplug.core.errors import ConfigError
from hwplug.core.hookspecs import hookimpl
from hwplug.core.platform import DeviceInfo, Platform
from hwplug.platforms.hpu.graphs import HPUGraphWrapper
from hwplug.platforms.hpu.probe import probe_habana
from hwplug.platforms.hpu.profiles import PROFILES
from hwplug.platforms.vendor import (
    VendorPlatform,
    fill_unset,
    is_fp8_cache,
    model_dtype_message,
)

if TYPE_CHECKING:
    from hwplug.core.config import EngineConfig
    from hwplug.core.resolve import ChangeLog

__all__ = ["HpuPlatform", "hwplug_platforms"]


class HpuPlatform(VendorPlatform):
    """Intel Gaudi (HPU graphs, HCCL, ``HABANA_VISIBLE_MODULES``)."""

    name = "hpu"
    device_type = "hpu"
    dist_backend = "hccl"
    priority = 10
    ray_device_key = "HPU"
    device_control_env_var = "HABANA_VISIBLE_MODULES"
    vendor = "Intel Habana"

    block_sizes = (128, 256)
    default_block = 128

    cache_dtypes = ("auto", "bfloat16", "fp8_inc")
    fp8_feature: ClassVar[str] = "fp8"
    """Device feature flag of the generations with fp8 (Gaudi 2 and later)."""
    fp8_dtype_name = "float8_e4m3fn"
    """Storage type of ``fp8_inc``; there is no plain ``fp8`` on Gaudi."""
    fp8_cache_dtype = "fp8_inc"

    model_dtypes = ("bfloat16",)

    supports_device_graphs = True
    supports_piecewise_graphs = False
    graphs_need_compilation = False
    default_compilation_level = 0
    max_compilation_level = 2
    representative_profile = "gaudi2"
    profile_table = PROFILES
    custom_op_forward = "forward_hpu"
    attention_order = ("torch",)
    fits_graph_mode_to_attention = False  # HPU graphs capture the attention too

    custom_ops_default: ClassVar[tuple[str, ...]] = ("all",)
    """``compilation.custom_ops`` filled in when unset: Gaudi's fused kernels."""
    compile_backend: ClassVar[str] = "hpu_backend"
    """``compilation.backend`` filled in at levels 1-2 when unset."""

    # -- discovery -----------------------------------------------------------
    @classmethod
    def detect(cls) -> list[DeviceInfo]:
        """Gaudi accelerators: PCI vendor 0x1da3 with the habanalabs driver (no torch)."""
        return list(probe_habana())

    # -- KV cache ------------------------------------------------------------------
    def device_cache_dtype_problem(self, cache_dtype: str) -> str | None:
        if cache_dtype == "fp8_inc":
            if self.devices and not self.has_feature(self.fp8_feature):
                return "fp8_inc needs Gaudi2 or later (this is a first-generation Gaudi)"
            return None
        if is_fp8_cache(cache_dtype):
            return (
                "Gaudi stores fp8 KV caches only in the fp8_inc (Intel Neural Compressor) "
                "format, on Gaudi2 and later"
            )
        return None

    def cache_dtype_torch_name(self, cache_dtype: str) -> str:
        """As the base, but there is no plain ``fp8`` on Gaudi: only ``fp8_inc``."""
        if cache_dtype == "fp8":
            raise ConfigError(
                f"cache.cache_dtype='fp8' has no meaning on {self.describe_device()}: Gaudi "
                "stores fp8 KV caches only as fp8_inc; use fp8_inc"
            )
        return super().cache_dtype_torch_name(cache_dtype)

    # -- model dtypes -----------------------------------------------------------------
    def model_dtype_problem(self, dtype: str, config: EngineConfig | None) -> str | None:
        if self.supports_dtype(dtype):
            return None
        return model_dtype_message(self, dtype, "Gaudi runs models in bfloat16 only", ["bfloat16"])

    # -- compilation -------------------------------------------------------------------
    def compilation_level_problem(self, level: int) -> str | None:
        if level <= self.max_compilation_level:
            return None
        return (
            f"compilation.level={level} is not supported on {self.describe_device()}: HPU "
            "graphs capture the whole forward pass, so there is no piecewise compilation; "
            "use compilation.level=0, 1 or 2"
        )

    def check_and_update_config(self, config: EngineConfig, changes: ChangeLog) -> None:
        """Block size 128; custom ops ``all``; ``hpu_backend`` at levels 1-2."""
        super().check_and_update_config(config, changes)
        fill_unset(
            changes,
            "compilation.custom_ops",
            list(self.custom_ops_default),
            "Gaudi runs its fused custom kernels",
        )
        level = config.compilation.level
        if level is not None and 1 <= level <= 2:
            fill_unset(
                changes,
                "compilation.backend",
                self.compile_backend,
                f"torch.compile on Gaudi uses {self.compile_backend}",
            )

    # -- graphs ----------------------------------------------------------------------
    def graph_wrapper_cls(self) -> type | None:
        """The HPU-graph wrapper (``habana_frameworks.torch.hpu`` graphs)."""
        return HPUGraphWrapper


@hookimpl
def hwplug_platforms() -> list[type[Platform]]:
    """The built-in Intel Gaudi platform."""
    return [HpuPlatform]
