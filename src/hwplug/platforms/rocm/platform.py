"""AMD GPUs through ROCm (HIP behind the ``torch.cuda`` API).

Most rules depend on the GPU's ISA generation (``gfx942`` and so on): fp8 KV
caches need gfx94x, gfx95x or gfx12, and gfx94x (MI300X, MI325X) stores fp8
in the FNUZ encoding. Device queries on real hardware go to amdsmi first,
then to what detection found, and only then to ``torch.cuda``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from hwplug.core.hookspecs import hookimpl
from hwplug.core.platform import DeviceCapability, DeviceInfo, Platform
from hwplug.platforms.cuda_graphs import CUDAGraphWrapper
from hwplug.platforms.rocm.gfx import gfx_arch_name, gfx_capability, gfx_version
from hwplug.platforms.rocm.probe import probe_amd
from hwplug.platforms.rocm.profiles import PROFILES
from hwplug.platforms.sysfs import AMDSMI
from hwplug.platforms.vendor import DeviceQuery, VendorPlatform

if TYPE_CHECKING:
    from hwplug.core.config import ModelConfig

__all__ = ["RocmPlatform", "hwplug_platforms"]


class RocmPlatform(VendorPlatform):
    """AMD Instinct and Radeon GPUs (HIP graphs, RCCL, ``HIP_VISIBLE_DEVICES``)."""

    name = "rocm"
    device_type = "cuda"
    dist_backend = "nccl"
    priority = 10
    ray_device_key = "GPU"
    device_control_env_var = "HIP_VISIBLE_DEVICES"
    vendor = "AMD"

    block_sizes = (16, 32)
    default_block = 16
    mla_block_sizes: ClassVar[tuple[int, ...]] = (1, 16, 32)
    """Block sizes for MLA models: the AITER MLA kernel takes block size 1."""

    cache_dtypes = ("auto", "bfloat16", "fp8", "fp8_e4m3")
    fp8_archs: ClassVar[tuple[str, ...]] = ("gfx94", "gfx95", "gfx12")
    """gfx arch prefixes with fp8 support (MI300 class and later, RDNA4)."""
    fnuz_archs: ClassVar[tuple[str, ...]] = ("gfx94",)
    """gfx arch prefixes whose fp8 is e4m3fnuz (MI300X, MI325X)."""
    fp8_format = "fp8_e4m3"
    """The format the ``fp8`` alias stands for."""

    model_dtypes = ("bfloat16", "float16", "float32")
    bf16_min_arch: ClassVar[tuple[int, int, int]] = (9, 0, 0xA)
    """bfloat16 (models and caches) needs gfx90a or later."""

    supports_device_graphs = True
    supports_piecewise_graphs = True
    graphs_need_compilation = True
    default_compilation_level = 3
    max_compilation_level = 3
    representative_profile = "mi300x"
    profile_table = PROFILES
    custom_op_forward = "forward_hip"
    attention_order = ("triton", "torch")
    runs_triton = True
    pins_host_memory = True

    # -- discovery -----------------------------------------------------------
    @classmethod
    def detect(cls) -> list[DeviceInfo]:
        """AMD GPUs from the KFD topology in sysfs and amdsmi (no torch)."""
        return list(probe_amd())

    # -- the ISA generation ------------------------------------------------------
    def device_arch(self, i: int = 0) -> str | None:
        """The gfx arch of device ``i`` (``"gfx942"``), None when unknown.

        Detection (or the profile) records it; on real hardware without it,
        amdsmi is asked, then ``torch.cuda`` (which initialises HIP).
        """
        detected = self.devices[i] if 0 <= i < len(self.devices) else None
        if detected is not None and detected.arch:
            return detected.arch
        arch: str | None = self.query_device("arch", i)
        return arch

    def _arch_is(self, prefixes: tuple[str, ...]) -> bool:
        arch = self.device_arch(0) if self.devices else None
        return arch is not None and arch.lower().startswith(prefixes)

    def _has_bf16(self) -> bool:
        version = gfx_version(self.device_arch(0) if self.devices else None)
        return version is None or version >= self.bf16_min_arch

    @property
    def fp8_dtype_name(self) -> str:  # type: ignore[override]
        """``float8_e4m3fnuz`` on gfx94x (MI300X, MI325X), else ``float8_e4m3fn``."""
        return "float8_e4m3fnuz" if self._arch_is(self.fnuz_archs) else "float8_e4m3fn"

    def is_fp8_fnuz(self) -> bool:
        """True on gfx94x: no negative zero, no infinities, exponent bias 8."""
        return self._arch_is(self.fnuz_archs)

    # -- device queries ---------------------------------------------------------
    library = AMDSMI
    device_queries = {
        "arch": DeviceQuery(
            vendor=lambda smi, h: _smi_arch(smi, h),
            torch_cuda=lambda tc, i: gfx_arch_name(tc.get_device_properties(i).gcnArchName),
        ),
        "capability": DeviceQuery(
            vendor=lambda smi, h: gfx_capability(_smi_arch(smi, h)),
            detected=lambda d: d.capability or gfx_capability(d.arch),
            torch_cuda=lambda tc, i: DeviceCapability(*tc.get_device_capability(i)),
        ),
        "name": DeviceQuery(
            vendor=lambda smi, h: str(smi.amdsmi_get_gpu_asic_info(h)["market_name"]),
            detected=lambda d: d.name,
            torch_cuda=lambda tc, i: str(tc.get_device_name(i)),
        ),
        "memory": DeviceQuery(
            vendor=lambda smi, h: int(
                smi.amdsmi_get_gpu_memory_total(h, smi.AmdSmiMemoryType.VRAM)
            ),
            detected=lambda d: d.total_memory,
            torch_cuda=lambda tc, i: int(tc.get_device_properties(i).total_memory),
        ),
        "memory usage": DeviceQuery(
            vendor=lambda smi, h: int(
                smi.amdsmi_get_gpu_memory_usage(h, smi.AmdSmiMemoryType.VRAM)
            ),
            torch_cuda=lambda tc, i: int(tc.memory_allocated(i)),
            cached=False,
        ),
    }

    def library_handle(self, library: Any, target: Any) -> Any:
        """amdsmi's handle of the device at physical index ``target``."""
        return library.amdsmi_get_processor_handles()[target]

    def get_device_capability(self, i: int = 0) -> DeviceCapability | None:
        """The gfx arch as ``(major, minor)``, as torch reports it (gfx942 -> 9.4).

        Simulated: the profile's (or its arch's). Real: amdsmi (cached), the
        detected value, then ``torch.cuda``.
        """
        if self.simulated:
            cap = Platform.get_device_capability(self, i)
            return cap if cap is not None else gfx_capability(self.device_arch(i))
        return super().get_device_capability(i)

    # -- KV cache ------------------------------------------------------------------
    def supported_block_sizes(self, model_config: ModelConfig | None = None) -> tuple[int, ...]:
        if model_config is not None and model_config.use_mla:
            return self.mla_block_sizes
        return self.block_sizes

    def device_cache_dtype_problem(self, cache_dtype: str) -> str | None:
        if cache_dtype == "fp8_e5m2":
            return (
                f"ROCm stores fp8 KV caches only as {self.fp8_format}, "
                "on gfx94x, gfx95x and gfx12 GPUs"
            )
        arch = self.device_arch(0) if self.devices else None
        if arch is None:
            return None
        if cache_dtype in ("fp8", "fp8_e4m3") and not self._arch_is(self.fp8_archs):
            what = f"fp8 (= {self.fp8_format})" if cache_dtype == "fp8" else cache_dtype
            return f"{what} needs a gfx94x, gfx95x or gfx12 GPU, this one is {arch}"
        if cache_dtype == "bfloat16" and not self._has_bf16():
            return f"bfloat16 needs gfx90a or later, this GPU is {arch}"
        return None

    # -- model dtypes -----------------------------------------------------------------
    def bf16_problem(self) -> str | None:
        if self._has_bf16():
            return None
        return f"bfloat16 needs gfx90a or later, this GPU is {self.device_arch(0)}"

    def graph_wrapper_cls(self) -> type | None:
        """The CUDA-graph wrapper: HIP graphs through the ``torch.cuda`` API."""
        return CUDAGraphWrapper


@hookimpl
def hwplug_platforms() -> list[type[Platform]]:
    """The built-in ROCm platform."""
    return [RocmPlatform]


def _smi_arch(smi: Any, handle: Any) -> str | None:
    return gfx_arch_name(smi.amdsmi_get_gpu_asic_info(handle).get("target_graphics_version"))
