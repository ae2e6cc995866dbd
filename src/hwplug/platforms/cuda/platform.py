"""NVIDIA GPUs through CUDA.

The rules are data: which block sizes the attention kernels take, which
cache dtypes need which compute capability. Device queries on real hardware
go to NVML first (no CUDA context), then to what detection found, and only
then to ``torch.cuda``, which initialises CUDA in the calling process.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, ClassVar

from hwplug.core.hookspecs import hookimpl
from hwplug.core.platform import DeviceCapability, DeviceInfo, Platform
from hwplug.platforms.cuda.probe import probe_nvidia
from hwplug.platforms.cuda.profiles import PROFILES
from hwplug.platforms.cuda_graphs import CUDAGraphWrapper
from hwplug.platforms.sysfs import NVML, library_text
from hwplug.platforms.vendor import DeviceQuery, VendorPlatform

if TYPE_CHECKING:
    from hwplug.core.config import EngineConfig, ModelConfig
    from hwplug.core.resolve import ChangeLog

__all__ = ["CudaPlatform", "hwplug_platforms"]


class CudaPlatform(VendorPlatform):
    """NVIDIA GPUs (CUDA graphs, NCCL, ``CUDA_VISIBLE_DEVICES``)."""

    name = "cuda"
    device_type = "cuda"
    dist_backend = "nccl"
    priority = 10
    ray_device_key = "GPU"
    device_control_env_var = "CUDA_VISIBLE_DEVICES"
    vendor = "NVIDIA"

    block_sizes = (8, 16, 32)
    default_block = 16
    mla_block_sizes: ClassVar[tuple[int, ...]] = (16, 32, 64, 128)
    """Block sizes the MLA kernels take (``model.use_mla``)."""
    mla_default_block_by_major: ClassVar[dict[int, int]] = {10: 128, 9: 64}
    """MLA default block size by compute-capability major (Blackwell 128, Hopper 64); else 16."""

    cache_dtypes = ("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2")
    cache_dtype_min_capability: ClassVar[dict[str, DeviceCapability]] = {
        "bfloat16": DeviceCapability(8, 0),
        "fp8": DeviceCapability(8, 9),
        "fp8_e4m3": DeviceCapability(8, 9),
        "fp8_e5m2": DeviceCapability(8, 0),
    }
    """Lowest compute capability that stores each cache dtype (absent: any)."""
    fp8_format = "fp8_e4m3"
    """The format the ``fp8`` alias stands for."""
    fp8_dtype_name = "float8_e4m3fn"

    model_dtypes = ("bfloat16", "float16", "float32")
    bf16_min_capability: ClassVar[DeviceCapability] = DeviceCapability(8, 0)
    """Lowest compute capability that runs bfloat16 models (Ampere)."""

    supports_device_graphs = True
    supports_piecewise_graphs = True
    graphs_need_compilation = True
    default_compilation_level = 3
    max_compilation_level = 3
    representative_profile = "h100"
    profile_table = PROFILES
    custom_op_forward = "forward_cuda"
    attention_order = ("triton", "torch")
    runs_triton = True
    pins_host_memory = True

    # -- discovery -----------------------------------------------------------
    @classmethod
    def detect(cls) -> list[DeviceInfo]:
        """NVIDIA GPUs from sysfs, ``/proc/driver/nvidia`` and NVML (no torch)."""
        return list(probe_nvidia())

    # -- device queries ---------------------------------------------------------
    library = NVML
    device_queries = {
        "capability": DeviceQuery(
            vendor=lambda nv, h: DeviceCapability(*nv.nvmlDeviceGetCudaComputeCapability(h)),
            detected=lambda d: d.capability,
            torch_cuda=lambda tc, i: DeviceCapability(*tc.get_device_capability(i)),
        ),
        "name": DeviceQuery(
            vendor=lambda nv, h: library_text(nv.nvmlDeviceGetName(h)),
            detected=lambda d: d.name,
            torch_cuda=lambda tc, i: str(tc.get_device_name(i)),
        ),
        "memory": DeviceQuery(
            vendor=lambda nv, h: int(nv.nvmlDeviceGetMemoryInfo(h).total),
            detected=lambda d: d.total_memory,
            torch_cuda=lambda tc, i: int(tc.get_device_properties(i).total_memory),
        ),
        "memory usage": DeviceQuery(
            vendor=lambda nv, h: int(nv.nvmlDeviceGetMemoryInfo(h).used),
            torch_cuda=lambda tc, i: int(tc.memory_allocated(i)),
            cached=False,
        ),
    }

    def library_target(self, i: int) -> int | str:
        """The NVML index of logical device ``i``, or the UUID the visibility variable gives."""
        try:
            return self.device_id_to_physical_device_id(i)
        except ValueError:
            entries = os.environ.get(self.device_control_env_var, "").split(",")
            return entries[i].strip()

    def library_handle(self, library: Any, target: Any) -> Any:
        if isinstance(target, int):
            return library.nvmlDeviceGetHandleByIndex(target)
        return library.nvmlDeviceGetHandleByUUID(target)

    def _capability(self) -> DeviceCapability | None:
        return self.get_device_capability(0) if self.devices else None

    # -- KV cache ------------------------------------------------------------------
    def default_block_size(self, config: EngineConfig) -> int:
        """16; for MLA models 128 on compute capability 10.x, 64 on 9.x."""
        if config.model.use_mla:
            cap = self._capability()
            if cap is not None:
                return self.mla_default_block_by_major.get(cap.major, self.default_block)
        return self.default_block

    def supported_block_sizes(self, model_config: ModelConfig | None = None) -> tuple[int, ...]:
        if model_config is not None and model_config.use_mla:
            return self.mla_block_sizes
        return self.block_sizes

    def device_cache_dtype_problem(self, cache_dtype: str) -> str | None:
        need = self.cache_dtype_min_capability.get(cache_dtype)
        cap = self._capability()
        if need is None or cap is None or cap >= need:
            return None
        what = f"fp8 (= {self.fp8_format})" if cache_dtype == "fp8" else cache_dtype
        return f"{what} needs compute capability >= {need}, this GPU has {cap}"

    def check_and_update_config(self, config: EngineConfig, changes: ChangeLog) -> None:
        """Block size: 16, or the MLA kernels' size for MLA models."""
        if config.cache.block_size is None and config.model.use_mla:
            size = self.default_block_size(config)
            changes.record(
                "cache.block_size",
                size,
                f"MLA attention on {self.describe_device()} pages the cache in blocks of {size}",
            )
        super().check_and_update_config(config, changes)

    # -- model dtypes -----------------------------------------------------------------
    def bf16_problem(self) -> str | None:
        cap = self._capability()
        if cap is None or cap >= self.bf16_min_capability:
            return None
        return (
            f"bfloat16 needs compute capability >= {self.bf16_min_capability}, this GPU has {cap}"
        )

    # -- graphs ----------------------------------------------------------------------
    def graph_wrapper_cls(self) -> type | None:
        """The CUDA-graph wrapper (``torch.cuda.CUDAGraph``)."""
        return CUDAGraphWrapper


@hookimpl
def hwplug_platforms() -> list[type[Platform]]:
    """The built-in CUDA platform."""
    return [CudaPlatform]
