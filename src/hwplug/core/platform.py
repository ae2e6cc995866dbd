"""The platform contract: what a kind of hardware tells hwplug about itself.

A :class:`Platform` subclass describes one kind of accelerator (or the CPU).
Its class attributes and small data tables (block sizes, cache dtypes, model
dtypes) carry most of the knowledge; vendors override only what differs from
the defaults below. Nothing here knows any particular chip.

A platform keeps the rules; the device services an engine calls while it runs
(SPEC 13 and 14) live in its runtime object (:mod:`hwplug.core.runtime`), which
:attr:`Platform.runtime` hands out and the platform's service methods hand over to.

Nothing in this module imports torch at import time; methods that need torch
say so and import it lazily.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

from hwplug.core.dtypes import CACHE_DTYPE_FORMATS, canonical_dtype
from hwplug.core.errors import ConfigError, PluginError, brief
from hwplug.core.graphs import GraphDispatcher, GraphWrapper
from hwplug.core.runtime import DIST_TIMEOUT, DeviceRuntime

FP8_TORCH_NAMES = ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz")
"""The torch float8 dtypes hwplug's KV-cache kernels store (what ``fp8_dtype_name`` may be)."""

if TYPE_CHECKING:
    import torch

    from hwplug.core.config import EngineConfig, ModelConfig
    from hwplug.core.distributed import DeviceCommunicator, ModelParallelGroups
    from hwplug.core.resolve import ChangeLog

__all__ = [
    "MAX_DEVICES",
    "DeviceCapability",
    "DeviceInfo",
    "Platform",
    "ascii_decimal",
    "parse_profile_spec",
]

GiB = 1 << 30
MAX_MEMORY = 1 << 60
"""The largest memory figure in bytes a device may report."""


class DeviceCapability(NamedTuple):
    """A CUDA-style compute capability ``major.minor``.

    Compares with tuples (``cap >= (8, 9)``) and with integers in the
    ``major * 10 + minor`` form (``cap >= 89``).
    """

    major: int
    minor: int

    def as_version_str(self) -> str:
        """``"8.9"`` for capability 8.9."""
        return f"{self.major}.{self.minor}"

    @classmethod
    def parse(cls, value: object) -> DeviceCapability:
        """Build a capability from ``(8, 9)``, ``89``, ``"8.9"`` or a capability."""
        if isinstance(value, DeviceCapability):
            return value
        if isinstance(value, bool):
            raise ValueError(f"not a device capability: {value!r}")
        if isinstance(value, int):
            if value < 0:
                raise ValueError(f"device capability must be non-negative, got {value}")
            return cls(value // 10, value % 10)
        if isinstance(value, str):
            major, sep, minor = value.strip().partition(".")
            major_n, minor_n = ascii_decimal(major), ascii_decimal(minor)
            if sep and major_n is not None and minor_n is not None:
                return cls(major_n, minor_n)
            raise ValueError(f"device capability must look like '8.9', got {brief(value)}")
        if isinstance(value, Sequence) and len(value) == 2:
            major_v, minor_v = value
            if isinstance(major_v, int) and isinstance(minor_v, int):
                return cls(major_v, minor_v)
        raise ValueError(
            f"device capability must be (major, minor), an int like 89 or '8.9', got {value!r}"
        )

    def _other(self, other: object) -> tuple[int, int] | None:
        if isinstance(other, bool):
            return None
        if isinstance(other, int):
            return (other // 10, other % 10)
        if isinstance(other, tuple) and len(other) == 2:
            return (other[0], other[1])
        return None

    def __eq__(self, other: object) -> bool:
        value = self._other(other)
        return value is not None and (self.major, self.minor) == value

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __lt__(self, other: object) -> bool:
        value = self._other(other)
        if value is None:
            return NotImplemented
        return (self.major, self.minor) < value

    def __le__(self, other: object) -> bool:
        value = self._other(other)
        if value is None:
            return NotImplemented
        return (self.major, self.minor) <= value

    def __gt__(self, other: object) -> bool:
        value = self._other(other)
        if value is None:
            return NotImplemented
        return (self.major, self.minor) > value

    def __ge__(self, other: object) -> bool:
        value = self._other(other)
        if value is None:
            return NotImplemented
        return (self.major, self.minor) >= value

    def __hash__(self) -> int:
        return hash((self.major, self.minor))

    def __str__(self) -> str:
        return self.as_version_str()


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    """One device, as detected or as simulated.

    ``total_memory`` is in bytes (0 when unknown); ``capability`` is the CUDA
    compute capability where it applies; ``arch`` names the ISA generation
    (``"gfx942"``); ``features`` holds capability flags such as ``"amx_bf16"``
    or ``"ipex"``.
    """

    name: str
    total_memory: int = 0
    capability: DeviceCapability | None = None
    arch: str | None = None
    vendor: str = ""
    features: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.capability is not None and not isinstance(self.capability, DeviceCapability):
            object.__setattr__(self, "capability", DeviceCapability.parse(self.capability))
        if not isinstance(self.features, frozenset):
            object.__setattr__(self, "features", frozenset(self.features))
        memory = self.total_memory
        if isinstance(memory, bool) or not isinstance(memory, int) or not 0 <= memory <= MAX_MEMORY:
            raise ConfigError(
                f"DeviceInfo.total_memory must be a number of bytes from 0 to 2**60, "
                f"got {brief(memory)}"
            )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready description."""
        return {
            "name": self.name,
            "total_memory": self.total_memory,
            "capability": None if self.capability is None else self.capability.as_version_str(),
            "arch": self.arch,
            "vendor": self.vendor,
            "features": sorted(self.features),
        }


MAX_DEVICES = 1 << 20
"""The largest device count a profile spec may ask for."""


def ascii_decimal(text: str, max_digits: int = 18) -> int | None:
    """``text`` as a non-negative ASCII decimal of at most ``max_digits`` digits, else None.

    ``str.isdigit`` accepts ``"²"``, which ``int`` refuses: user and kernel
    text is checked with this instead.
    """
    text = text.strip()
    if text and len(text) <= max_digits and text.isascii() and text.isdecimal():
        return int(text)
    return None


def parse_profile_spec(spec: str) -> tuple[str, int]:
    """Split ``"h100:8"`` into ``("h100", 8)``; a bare name means one device.

    :raises ConfigError: no name, or a count that is not an integer in
        1..2**20.
    """
    if not isinstance(spec, str):
        raise ConfigError(f"a device profile must be a string such as 'h100:8', got {brief(spec)}")
    name, sep, count_text = spec.strip().partition(":")
    name = name.strip().lower()
    if not name:
        raise ConfigError(
            f"empty device profile in {brief(spec)}; expected a name such as 'h100:8'"
        )
    if not sep:
        return name, 1
    count = ascii_decimal(count_text)
    if count is None or not 1 <= count <= MAX_DEVICES:
        raise ConfigError(
            f"device count in profile {brief(spec)} must be a positive integer up to "
            f"{MAX_DEVICES}, as in 'h100:8'"
        )
    return name, count


class Platform:
    """Base class of every platform, built-in or vendor-provided.

    Class attributes identify the platform and hold its rule tables; the
    defaults suit a vendor that overrides little. An instance is bound to the
    devices it runs on (detected, or simulated from a profile).
    """

    # -- identity -----------------------------------------------------------
    name: ClassVar[str] = ""
    """Short platform name used by ``HWPLUG_PLATFORM`` and in messages."""
    device_type: ClassVar[str] = ""
    """torch device type (``torch.device(device_type)``)."""
    dist_backend: ClassVar[str] = ""
    """torch.distributed backend name."""
    priority: ClassVar[int] = 50
    """Selection rank among present platforms; higher wins."""
    ray_device_key: ClassVar[str] = ""
    """Ray resource name for this device; empty when Ray cannot place it."""
    device_control_env_var: ClassVar[str] = ""
    """Environment variable that restricts the visible devices."""
    communicator_cls: ClassVar[type | None] = None
    """The :class:`~hwplug.core.distributed.DeviceCommunicator` subclass
    :meth:`device_communicator` returns; None: the default one (torch.distributed
    collectives on the group)."""
    runtime_cls: ClassVar[type[DeviceRuntime]] = DeviceRuntime
    """The :class:`~hwplug.core.runtime.DeviceRuntime` subclass :attr:`runtime` is built
    from: the default drives ``torch.<device_type>``; a platform whose device is driven
    otherwise (the host CPU, a vendor's runtime library) names its own."""
    vendor: ClassVar[str] = ""
    """Human-readable vendor name."""

    # -- rule tables (data, overridden per platform) --------------------------
    block_sizes: ClassVar[tuple[int, ...]] = (1, 8, 16, 32, 64, 128, 256)
    """Allowed KV-cache block sizes."""
    default_block: ClassVar[int] = 16
    """Block size filled in when the user leaves it unset."""
    cache_dtypes: ClassVar[tuple[str, ...]] = ("auto", "bfloat16")
    """KV-cache dtypes this platform can store."""
    model_dtypes: ClassVar[tuple[str, ...]] = ("bfloat16", "float16", "float32")
    """Model dtypes, in order of preference (the first fills ``dtype="auto"``)."""
    fp8_dtype_name: ClassVar[str] = "float8_e4m3fn"
    """torch dtype name that ``fp8`` stands for."""
    supports_device_graphs: ClassVar[bool] = False
    """Whether the platform captures device graphs (CUDA graphs, HPU graphs)."""
    supports_piecewise_graphs: ClassVar[bool] = True
    """With device graphs: whether pieces of a split graph can be captured (not on HPU)."""
    graphs_need_compilation: ClassVar[bool] = True
    """With device graphs: whether capture goes through piecewise compilation (CUDA)."""
    default_compilation_level: ClassVar[int] = 0
    """Compilation level filled in when unset (a ``CompilationLevel`` value)."""
    max_compilation_level: ClassVar[int] = 3
    """Highest compilation level the platform can run."""
    enable_prefix_caching_default: ClassVar[bool] = True
    """Prefix caching filled in when ``cache.enable_prefix_caching`` is unset."""
    enable_chunked_prefill_default: ClassVar[bool] = True
    """Chunked prefill filled in when ``scheduler.enable_chunked_prefill`` is unset."""
    representative_profile: ClassVar[str | None] = None
    """The profile that stands for this platform in test matrices and ``use_platform(name)``."""
    custom_op_forward: ClassVar[str] = "forward_oot"
    """The method an enabled custom op runs here (``forward_cuda``, ``forward_cpu``...)."""
    attention_order: ClassVar[tuple[str, ...]] = ("torch",)
    """Attention backends in order of preference (see :meth:`attention_backends`)."""
    fits_graph_mode_to_attention: ClassVar[bool] = True
    """Whether resolution fits ``compilation.cudagraph_mode`` to the attention backend's
    graph support (CUDA-style graphs; HPU graphs hold the attention and opt out)."""
    runs_triton: ClassVar[bool] = False
    """Whether Triton compiles kernels for this platform's devices (tensors of type
    :attr:`device_type`); hwplug's Triton kernels and ``triton`` attention ask it."""
    pins_host_memory: ClassVar[bool] = False
    """Whether host-to-device copies (per-step attention metadata) go through pinned
    (page-locked) host memory, so they can run without blocking the host."""
    fp8_cache_dtype: ClassVar[str] = "fp8"
    """The ``cache.cache_dtype`` string that stores :meth:`fp8_dtype` here (a platform
    whose fp8 cache has its own name sets it)."""
    kv_budget_counts_memory_in_use: ClassVar[bool] = True
    """Whether :meth:`kv_cache_budget_bytes` is reduced by the memory already in use
    (weights and activations): an engine then measures it after a profile run of
    its largest step (:func:`hwplug.core.kv_cache.needs_memory_profile`). A platform
    with a dedicated KV space (the CPU's) sets it False."""
    linear_backend: ClassVar[str] = "torch"
    """The GEMM an engine's dense linear layers run on here: the ``backend`` of
    :func:`hwplug.kernels.linear` (``"torch"``; ``"native"`` or ``"onednn"`` on CPUs)."""

    def __init__(
        self,
        devices: Iterable[DeviceInfo] = (),
        *,
        simulated: bool = False,
        profile: str | None = None,
    ) -> None:
        self.devices: tuple[DeviceInfo, ...] = tuple(devices)
        self.simulated = simulated
        self.profile = profile

    def __repr__(self) -> str:
        kind = f"simulated {self.profile}" if self.simulated else "detected"
        return f"<{type(self).__name__} {self.name!r} {kind}, {len(self.devices)} device(s)>"

    # -- discovery ----------------------------------------------------------
    @classmethod
    def detect(cls) -> list[DeviceInfo]:
        """Return the devices present, or an empty list when absent.

        Must not import torch or initialise any device runtime.
        """
        return []

    @classmethod
    def profiles(cls) -> dict[str, DeviceInfo]:
        """Simulated devices this platform knows, by profile name."""
        return {}

    @classmethod
    def representative(cls) -> str | None:
        """The profile that stands for this platform: ``representative_profile``
        when it names one of :meth:`profiles`, else the first; None without profiles."""
        own = cls.profiles()
        rep = cls.representative_profile
        return rep if rep in own else next(iter(own), None)

    @classmethod
    def simulate(cls, profile: str) -> Platform:
        """An instance of this platform on ``profile`` (``"h100"`` or ``"h100:8"``)."""
        name, count = parse_profile_spec(profile)
        known = cls.profiles()
        if name not in known:
            raise ConfigError(
                f"unknown {cls.name} profile {name!r}; known profiles: {', '.join(sorted(known))}"
            )
        spec = name if count == 1 else f"{name}:{count}"
        return cls([known[name]] * count, simulated=True, profile=spec)

    # -- identity helpers ----------------------------------------------------
    def is_cuda(self) -> bool:
        """Whether this is the CUDA platform (NVIDIA GPUs)."""
        return self.name == "cuda"

    def is_rocm(self) -> bool:
        """Whether this is the ROCm platform (AMD GPUs)."""
        return self.name == "rocm"

    def is_cpu(self) -> bool:
        """Whether this is the CPU platform."""
        return self.name == "cpu"

    def is_hpu(self) -> bool:
        """Whether this is the HPU platform (Intel Gaudi)."""
        return self.name == "hpu"

    def is_xpu(self) -> bool:
        """Whether this is the XPU platform (Intel GPUs)."""
        return self.name == "xpu"

    def is_cuda_alike(self) -> bool:
        """CUDA or ROCm: both drive devices through the ``torch.cuda`` API."""
        return self.is_cuda() or self.is_rocm()

    @property
    def device(self) -> DeviceInfo | None:
        """The first device, or None when the platform has none."""
        return self.devices[0] if self.devices else None

    def describe_device(self) -> str:
        """A short device description for error messages."""
        if not self.devices:
            return f"the {self.name} platform"
        dev = self.devices[0]
        detail = []
        if dev.capability is not None:
            detail.append(f"compute capability {dev.capability.as_version_str()}")
        if dev.arch:
            detail.append(dev.arch)
        suffix = f" ({', '.join(detail)})" if detail else ""
        return f"{dev.name}{suffix}"

    def has_feature(self, feature: str, i: int = 0) -> bool:
        """Whether device ``i`` carries capability flag ``feature``."""
        return len(self.devices) > i and feature in self.devices[i].features

    # -- device queries --------------------------------------------------------
    def _device(self, i: int) -> DeviceInfo:
        if not 0 <= i < len(self.devices):
            raise IndexError(
                f"device index {i} out of range: the {self.name} platform has "
                f"{len(self.devices)} device(s)"
            )
        return self.devices[i]

    def get_device_capability(self, i: int = 0) -> DeviceCapability | None:
        """Compute capability of device ``i``; None where the notion does not apply.

        Never initialises a device runtime on the base class.
        """
        if not self.devices:
            return None
        return self._device(i).capability

    def has_device_capability(self, capability: object, i: int = 0) -> bool:
        """Whether device ``i`` has at least ``capability`` (``(8, 9)`` or ``89``)."""
        current = self.get_device_capability(i)
        if current is None:
            return False
        return current >= DeviceCapability.parse(capability)

    def get_device_name(self, i: int = 0) -> str:
        """Marketing name of device ``i``."""
        return self._device(i).name

    def get_device_total_memory(self, i: int = 0) -> int:
        """Total memory of device ``i`` in bytes."""
        return self._device(i).total_memory

    # -- KV cache ---------------------------------------------------------------
    def default_block_size(self, config: EngineConfig) -> int:
        """Block size filled in when ``cache.block_size`` is unset."""
        return self.default_block

    def supported_block_sizes(self, model_config: ModelConfig | None = None) -> tuple[int, ...]:
        """Block sizes the platform's attention kernels accept for this model."""
        return self.block_sizes

    def supported_cache_dtypes(self) -> tuple[str, ...]:
        """Cache-dtype strings this platform (and this device) can store."""
        return tuple(d for d in self.cache_dtypes if self.cache_dtype_problem(d, None) is None)

    def cache_dtype_problem(self, cache_dtype: str, config: EngineConfig | None) -> str | None:
        """Why ``cache_dtype`` cannot be used here, or None when it can.

        The message names the option, the device, and what would work.
        ``config`` may be None when the question is about the device alone.
        """
        if cache_dtype in self.cache_dtypes:
            fmt = CACHE_DTYPE_FORMATS.get(cache_dtype)
            if fmt is not None and fmt.torch_name is None and cache_dtype != "auto":
                problem = self.fp8_name_problem()  # 'fp8' means the platform's format
                if problem is not None:
                    others = ", ".join(c for c in self.cache_dtypes if c != cache_dtype)
                    return (
                        f"cache.cache_dtype={cache_dtype!r} cannot be used on "
                        f"{self.describe_device()}: {problem}; use one of: {others}"
                    )
            return None
        allowed = ", ".join(self.cache_dtypes)
        fmt = CACHE_DTYPE_FORMATS.get(cache_dtype)
        if fmt is not None and fmt.listed_only and fmt.note:
            return (
                f"cache.cache_dtype={cache_dtype!r} is {fmt.note} and is not available on "
                f"{self.describe_device()}; use one of: {allowed}"
            )
        return (
            f"cache.cache_dtype={cache_dtype!r} is not supported on {self.describe_device()}; "
            f"use one of: {allowed}"
        )

    def cache_dtype_torch_name(self, cache_dtype: str) -> str:
        """The torch dtype name a (non-``auto``) ``cache.cache_dtype`` stores here.

        ``fp8`` is :attr:`fp8_dtype_name`; formats with an FNUZ variant take it
        where :meth:`is_fp8_fnuz`; a format only some platforms have (see
        :class:`~hwplug.core.dtypes.CacheDtypeFormat`) must be in
        :attr:`cache_dtypes`. This maps names; whether this device can store
        the dtype is :meth:`cache_dtype_problem`'s verdict.

        :raises ConfigError: an unknown string, or a format this platform lacks.
        """
        fmt = CACHE_DTYPE_FORMATS.get(cache_dtype)
        if fmt is None or cache_dtype == "auto":
            raise ConfigError(
                f"cache.cache_dtype={brief(cache_dtype)} is not a cache dtype; use one of: "
                f"{', '.join(CACHE_DTYPE_FORMATS)}"
            )
        if fmt.listed_only and cache_dtype not in self.cache_dtypes:
            raise ConfigError(
                Platform.cache_dtype_problem(self, cache_dtype, None)
                or f"cache.cache_dtype={cache_dtype!r} is not available here"
            )
        if fmt.torch_name is None:
            problem = self.fp8_name_problem()
            if problem is not None:
                raise ConfigError(f"cache.cache_dtype={cache_dtype!r}: {problem}")
            return self.fp8_dtype_name
        if fmt.fnuz_torch_name is not None and self.is_fp8_fnuz():
            return fmt.fnuz_torch_name
        return fmt.torch_name

    def is_kv_cache_dtype_supported(self, cache_dtype: str, config: EngineConfig) -> bool:
        """Whether ``cache_dtype`` can be used with ``config`` on this device."""
        return self.cache_dtype_problem(cache_dtype, config) is None

    def fp8_name_problem(self) -> str | None:
        """What is wrong with :attr:`fp8_dtype_name`, or None when it names one of the
        float8 formats hwplug's kernels store."""
        name = self.fp8_dtype_name
        if isinstance(name, str) and name in FP8_TORCH_NAMES:
            return None
        return (
            f"platform {self.name!r} names no fp8 format: fp8_dtype_name is {brief(name)}; "
            f"its plugin must set it to one of {', '.join(FP8_TORCH_NAMES)}"
        )

    def fp8_dtype(self) -> torch.dtype:
        """The torch dtype that ``fp8`` stands for on this platform (imports torch).

        :raises PluginError: :attr:`fp8_dtype_name` names no float8 format.
        """
        problem = self.fp8_name_problem()
        if problem is not None:
            raise PluginError(problem)
        import torch

        dtype = getattr(torch, self.fp8_dtype_name)
        assert isinstance(dtype, torch.dtype)
        return dtype

    def is_fp8_fnuz(self) -> bool:
        """Whether ``fp8`` uses the FNUZ encoding (no negative zero, no infinities)."""
        return isinstance(self.fp8_dtype_name, str) and self.fp8_dtype_name.endswith("fnuz")

    # -- model dtypes -------------------------------------------------------------
    def supported_model_dtypes(self) -> tuple[str, ...]:
        """Model dtypes this device runs, most preferred first."""
        return self.model_dtypes

    def supports_dtype(self, dtype: Any) -> bool:
        """Whether the device runs a model in ``dtype`` (a string or torch.dtype)."""
        return canonical_dtype(dtype) in self.supported_model_dtypes()

    def model_dtype_problem(self, dtype: str, config: EngineConfig | None) -> str | None:
        """Why a model in ``dtype`` cannot run here, or None when it can."""
        if self.supports_dtype(dtype):
            return None
        allowed = ", ".join(self.supported_model_dtypes())
        return (
            f"model.dtype={dtype!r} is not supported on {self.describe_device()}; "
            f"use one of: {allowed}"
        )

    # -- engine defaults ---------------------------------------------------------------
    def default_prefix_caching(self, config: EngineConfig) -> tuple[bool, str]:
        """Value and reason for an unset ``cache.enable_prefix_caching``."""
        return self.enable_prefix_caching_default, f"default on {self.name}"

    def default_chunked_prefill(self, config: EngineConfig) -> tuple[bool, str]:
        """Value and reason for an unset ``scheduler.enable_chunked_prefill``."""
        return self.enable_chunked_prefill_default, f"default on {self.name}"

    def compilation_level_problem(self, level: int) -> str | None:
        """Why an explicit ``compilation.level`` cannot run here, or None when it can."""
        if level <= self.max_compilation_level:
            return None
        allowed = ", ".join(str(i) for i in range(self.max_compilation_level + 1))
        return (
            f"compilation.level={level} is not supported on {self.describe_device()}; "
            f"use one of: {allowed}"
        )

    # -- attention ------------------------------------------------------------------
    def attention_backends(self, config: EngineConfig) -> tuple[str, ...]:
        """Attention backends for ``config``, most preferred first.

        Resolution takes the first whose ``problem()`` is None when
        ``attention.backend`` is unset. The default is :attr:`attention_order`;
        a vendor platform may name its own backend (from its
        ``hwplug_attention_backends`` hook).
        """
        return self.attention_order

    # -- graphs and compilation -----------------------------------------------------
    def graph_wrapper_cls(self) -> type | None:
        """The graph-capture wrapper class for this platform's device, or None (eager).

        A subclass of :class:`hwplug.core.graphs.GraphWrapper` bound to the
        device's :class:`~hwplug.core.graphs.GraphBackend`. A device without
        graphs returns None even where the platform class has them.
        """
        return None

    def step_graph_wrapper_cls(self) -> type | None:
        """The wrapper of host step graphs for a device without device graphs, or None.

        A host step graph is a whole step compiled ahead for one graph key's
        static shapes, run with no per-step Python (the CPU platform's:
        :class:`hwplug.compilation.StepGraphWrapper`, Inductor with its C++
        wrapper). An engine builds one wrapper around its model, captures the
        keys of :meth:`step_graph_dispatcher` and dispatches each batch as it
        would for device graphs. The base has none.
        """
        return None

    def step_graph_sizes(self, config: EngineConfig) -> tuple[int, ...]:
        """The decode batch sizes (tokens) to build host step graphs for, largest first.

        Empty where :meth:`step_graph_wrapper_cls` is None (the base) or the
        config does not compile.
        """
        return ()

    def step_graph_dispatcher(self, config: EngineConfig) -> GraphDispatcher | None:
        """A dispatcher for this platform's host step graphs under ``config``, or None.

        Uniform decode batches of up to the largest of :meth:`step_graph_sizes`
        are padded to the next size and run as FULL graphs; every other batch
        runs as NONE (the engine's compiled model), as device graphs fall back.
        None without a step-graph wrapper or sizes, and on a device with graphs.
        """
        if self.has_device_graphs() or self.step_graph_wrapper_cls() is None:
            return None
        sizes = self.step_graph_sizes(config)
        if not sizes:
            return None
        # lazy: pydantic; resolving the current platform imports neither it nor torch
        from hwplug.core.config import CompilationConfig, CUDAGraphMode

        plan = CompilationConfig(cudagraph_mode=CUDAGraphMode.FULL_DECODE_ONLY)
        plan.init_with_cudagraph_sizes(list(sizes))
        return GraphDispatcher(plan, max_num_seqs=config.scheduler.max_num_seqs)

    def has_device_graphs(self) -> bool:
        """Whether this device captures graphs: :attr:`supports_device_graphs` and a
        graph wrapper (checked to be a ``GraphWrapper`` subclass).

        :raises PluginError: :meth:`graph_wrapper_cls` returned something else.
        """
        if not self.supports_device_graphs:
            return False
        wrapper = self.graph_wrapper_cls()
        if wrapper is None:
            return False

        if not (isinstance(wrapper, type) and issubclass(wrapper, GraphWrapper)):
            raise PluginError(
                f"platform {self.name!r}: graph_wrapper_cls() returned {brief(wrapper)}, which "
                "is not a subclass of hwplug.core.graphs.GraphWrapper; subclass it and "
                "return your GraphBackend from default_backend() (see docs/graphs.md)"
            )
        return True

    # -- configuration ----------------------------------------------------------------
    def check_and_update_config(self, config: EngineConfig, changes: ChangeLog) -> None:
        """Adjust ``config`` for this platform through ``changes.record``.

        Called by :func:`hwplug.resolve` after the engine defaults. Fill unset
        values (recording why) and raise :class:`ConfigError` for explicit
        values the platform cannot honour. The base fills the block size.
        """
        if config.cache.block_size is None:
            changes.record(
                "cache.block_size",
                self.default_block_size(config),
                f"default block size on {self.name}",
            )

    def verify_config(self, config: EngineConfig) -> None:
        """Last checks of a resolved config; raise :class:`ConfigError` if it cannot run."""
        block_size = config.cache.block_size
        allowed_blocks = self.supported_block_sizes(config.model)
        if block_size is not None and block_size not in allowed_blocks:
            mla = " for MLA models" if config.model.use_mla else ""
            raise ConfigError(
                f"cache.block_size={block_size} is not supported on "
                f"{self.describe_device()}{mla}; use one of: "
                f"{', '.join(str(b) for b in allowed_blocks)}"
            )
        problem = self.cache_dtype_problem(config.cache.cache_dtype, config)
        if problem is not None:
            raise ConfigError(problem)
        problem = self.model_dtype_problem(config.model.dtype, config)
        if problem is not None:
            raise ConfigError(problem)

    # -- KV memory ----------------------------------------------------------------------
    def kv_cache_budget_bytes(self, config: EngineConfig, used_bytes: int = 0) -> int:
        """Bytes available for the KV cache on one device.

        Default: ``gpu_memory_utilization`` x total device memory, less what is
        already used.
        """
        total = self.get_device_total_memory(0) if self.devices else 0
        return int(config.cache.gpu_memory_utilization * total) - used_bytes

    def kv_cache_budget_source(self, config: EngineConfig, used_bytes: int = 0) -> tuple[str, str]:
        """Where :meth:`kv_cache_budget_bytes` comes from, and the setting that raises it.

        Both are for messages, as in "there is 3.2 GiB (SOURCE); raise REMEDY".
        """
        total = self.get_device_total_memory(0) if self.devices else 0
        used = (
            f" minus {used_bytes / GiB:.2f} GiB ({used_bytes} bytes) already used"
            if used_bytes
            else ""
        )
        source = (
            f"cache.gpu_memory_utilization={config.cache.gpu_memory_utilization} x "
            f"{total / GiB:.2f} GiB of device memory{used}"
        )
        return source, "cache.gpu_memory_utilization (or set cache.kv_cache_memory_bytes)"

    # -- device visibility ---------------------------------------------------------------
    def device_id_to_physical_device_id(self, device_id: int) -> int:
        """Map a logical device index to the physical one through the visibility variable."""
        var = self.device_control_env_var
        value = os.environ.get(var, "") if var else ""
        if not value.strip():
            return device_id
        ids = [part.strip() for part in value.split(",") if part.strip()]
        if not 0 <= device_id < len(ids):
            raise IndexError(
                f"device {device_id} is not visible: {var}={value!r} lists {len(ids)} device(s)"
            )
        physical = ascii_decimal(ids[device_id])
        if physical is None:
            raise ValueError(
                f"{var}={brief(value)}: entry {brief(ids[device_id])} is not a device index; "
                "only integer indices can be mapped"
            )
        return physical

    # ==================================================================================
    # runtime services (SPEC 13, 14)
    #
    # What an engine calls while it runs lives in the platform's runtime object
    # (:attr:`runtime`, of class :attr:`runtime_cls`); these methods hand over to it,
    # so the names SPEC 13 and 14 give keep working on the platform.
    # ==================================================================================

    @property
    def runtime(self) -> DeviceRuntime:
        """This instance's device runtime: built from :attr:`runtime_cls` on first use,
        then the same object for the platform's life. Building it imports no torch.

        :raises PluginError: :attr:`runtime_cls` is not a ``DeviceRuntime`` subclass.
        """
        runtime = self.__dict__.get("_runtime")
        if runtime is not None:
            return runtime
        cls = self.runtime_cls
        if not (isinstance(cls, type) and issubclass(cls, DeviceRuntime)):
            raise PluginError(
                f"platform {self.name!r}: runtime_cls is {brief(cls)}, which is not a "
                "subclass of hwplug.core.runtime.DeviceRuntime"
            )
        # setdefault: threads that race here all get the runtime stored first
        return self.__dict__.setdefault("_runtime", cls(self))

    def torch_device(self, i: int = 0) -> torch.device:
        """The torch device for device ``i`` (see :meth:`DeviceRuntime.torch_device`)."""
        return self.runtime.torch_device(i)

    def set_device(self, i: int) -> None:
        """Make device ``i`` current (see :meth:`DeviceRuntime.set_device`)."""
        self.runtime.set_device(i)

    def synchronize(self) -> None:
        """Wait for the current device (see :meth:`DeviceRuntime.synchronize`)."""
        self.runtime.synchronize()

    def empty_cache(self) -> None:
        """Release cached device memory (see :meth:`DeviceRuntime.empty_cache`)."""
        self.runtime.empty_cache()

    def seed_everything(self, seed: int) -> None:
        """Seed every generator (see :meth:`DeviceRuntime.seed_everything`)."""
        self.runtime.seed_everything(seed)

    def mem_get_info(self, i: int = 0) -> tuple[int, int]:
        """``(free, total)`` bytes of device ``i`` (see :meth:`DeviceRuntime.mem_get_info`)."""
        return self.runtime.mem_get_info(i)

    def get_current_memory_usage(self, i: int = 0) -> int:
        """Bytes this process holds on device ``i``
        (see :meth:`DeviceRuntime.get_current_memory_usage`)."""
        return self.runtime.get_current_memory_usage(i)

    def peak_memory_usage(self, i: int = 0) -> int:
        """The most bytes held on device ``i`` since the last reset
        (see :meth:`DeviceRuntime.peak_memory_usage`)."""
        return self.runtime.peak_memory_usage(i)

    def init_distributed(
        self,
        rank: int,
        world_size: int,
        *,
        local_rank: int | None = None,
        init_method: str = "env://",
        timeout: timedelta = DIST_TIMEOUT,
    ) -> Any:
        """Bind this rank's device and join the default process group
        (see :meth:`DeviceRuntime.init_distributed`)."""
        return self.runtime.init_distributed(
            rank, world_size, local_rank=local_rank, init_method=init_method, timeout=timeout
        )

    def init_model_parallel(
        self,
        tensor_parallel_size: int,
        pipeline_parallel_size: int = 1,
        *,
        data_parallel_size: int = 1,
    ) -> ModelParallelGroups:
        """This rank's tensor- and pipeline-parallel groups and their communicators
        (SPEC 15; see :meth:`DeviceRuntime.init_model_parallel`)."""
        return self.runtime.init_model_parallel(
            tensor_parallel_size, pipeline_parallel_size, data_parallel_size=data_parallel_size
        )

    def destroy_distributed(self) -> None:
        """Leave the default process group (see :meth:`DeviceRuntime.destroy_distributed`)."""
        self.runtime.destroy_distributed()

    def device_communicator(self, group: Any = None) -> DeviceCommunicator:
        """The collectives of ``group`` (see :meth:`DeviceRuntime.device_communicator`)."""
        return self.runtime.device_communicator(group)
