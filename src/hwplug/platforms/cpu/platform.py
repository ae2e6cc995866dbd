"""The host CPU: always present, the lowest-priority platform.

Most of what the CPU can do depends on Intel Extension for PyTorch (IPEX):
without it the attention kernels take only block size 16 and store no fp8.
The KV cache lives in host memory, sized by ``cache.cpu_kvcache_space_bytes``
(or ``HWPLUG_CPU_KVCACHE_SPACE`` GiB) rather than a share of device memory.
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, ClassVar

from hwplug.core.errors import ConfigError, brief
from hwplug.core.hookspecs import hookimpl
from hwplug.core.platform import MAX_MEMORY, DeviceInfo, GiB, Platform, canonical_dtype
from hwplug.platforms.cpu.probe import probe_cpu
from hwplug.platforms.cpu.profiles import PROFILES
from hwplug.platforms.cpu.runtime import CpuRuntime
from hwplug.platforms.vendor import (
    VendorPlatform,
    fill_unset,
    is_fp8_cache,
    model_dtype_message,
)

if TYPE_CHECKING:
    from hwplug.core.config import EngineConfig, ModelConfig
    from hwplug.core.resolve import ChangeLog

__all__ = [
    "DEFAULT_STEP_GRAPH_SIZES",
    "KVCACHE_SPACE_ENV",
    "STEP_GRAPHS_ENV",
    "CpuPlatform",
    "hwplug_platforms",
]

STEP_GRAPHS_ENV = "HWPLUG_CPU_STEP_GRAPHS"
"""Environment variable: ``0`` turns the CPU's host step graphs off (default on)."""
DEFAULT_STEP_GRAPH_SIZES = (1,)
"""The decode sizes the CPU builds host step graphs for unless ``compilation.compile_sizes``
names others: one user's step, where host work weighs most and the graph was measured
faster on every model and dtype (docs/decisions.md, "Host step graphs"). Each size costs a
compilation of the whole model in the background (30-50 s for a 200M model on 2 cores)."""
KVCACHE_SPACE_ENV = "HWPLUG_CPU_KVCACHE_SPACE"
"""Environment variable: the CPU KV-cache space in GiB (a positive number)."""
MIN_KVCACHE_SPACE = 1 << 20
"""The smallest KV-cache space ``HWPLUG_CPU_KVCACHE_SPACE`` may give, in bytes (1 MiB)."""


class CpuPlatform(VendorPlatform):
    """The host CPU (gloo, ``CPU_VISIBLE_MEMORY_NODES``); IPEX unlocks more."""

    name = "cpu"
    device_type = "cpu"
    dist_backend = "gloo"
    priority = 0
    ray_device_key = ""
    device_control_env_var = "CPU_VISIBLE_MEMORY_NODES"
    vendor = "any"
    runtime_cls = CpuRuntime

    ipex_feature: ClassVar[str] = "ipex"
    """Device feature flag meaning intel_extension_for_pytorch is importable."""
    block_sizes = (16,)
    default_block = 16
    ipex_block_sizes: ClassVar[tuple[int, ...]] = (16, 32, 64, 128)
    """Block sizes the IPEX paged-attention kernels take."""
    ipex_default_block: ClassVar[int] = 128

    cache_dtypes = ("auto", "bfloat16", "fp8", "fp8_e5m2")
    ipex_cache_dtypes: ClassVar[frozenset[str]] = frozenset({"fp8", "fp8_e5m2"})
    """Cache dtypes only IPEX can store."""
    fp8_format = "fp8_e5m2"
    """The format the ``fp8`` alias stands for."""
    fp8_dtype_name = "float8_e5m2"

    model_dtypes = ("bfloat16", "float16", "float32")
    supports_device_graphs = False
    default_compilation_level = 2
    max_compilation_level = 3
    representative_profile = "cpu-generic"
    profile_table = PROFILES
    custom_op_forward = "forward_cpu"
    attention_order = ("torch",)
    linear_backend = "native"
    kv_budget_counts_memory_in_use = False

    mla_without_chunked_prefill = True
    min_compiling_level: ClassVar[int] = 2
    """Lowest compilation level at which Inductor compiles (and custom ops are turned off)."""
    inductor_defaults: ClassVar[dict[str, bool]] = {
        "dce": True,
        "epilogue_fusion": True,
        "size_asserts": False,
        "nan_asserts": False,
    }
    """Inductor options filled in (where unset) when the backend is ``inductor``."""
    default_kvcache_space_gib: ClassVar[float] = 4.0
    """KV-cache space when neither the config nor ``HWPLUG_CPU_KVCACHE_SPACE`` says."""
    compile_backend: ClassVar[str] = "inductor"
    """``compilation.backend`` filled in when unset."""
    executor_backend: ClassVar[str] = "mp"
    """The only executor for more than one rank."""

    # -- discovery -----------------------------------------------------------
    @classmethod
    def detect(cls) -> list[DeviceInfo]:
        """Always one device: this host's CPU (model, ISA flags, memory, IPEX)."""
        return [probe_cpu()]

    def has_ipex(self) -> bool:
        """Whether intel_extension_for_pytorch is importable (or the profile says so)."""
        return self.has_feature(self.ipex_feature)

    # -- host step graphs ----------------------------------------------------------
    def step_graph_wrapper_cls(self) -> type | None:
        """:class:`hwplug.compilation.StepGraphWrapper`: decode steps compiled by
        Inductor for their static shapes, kernels called from its C++ wrapper."""
        # lazy: the compilation package's import chain stays out of platform discovery
        from hwplug.compilation.step_graphs import StepGraphWrapper

        return StepGraphWrapper

    def step_graph_sizes(self, config: EngineConfig) -> tuple[int, ...]:
        """Decode batch sizes for host step graphs, largest first.

        None when the model does not compile with Inductor (a level below 2,
        ``enforce_eager``, another backend) or ``HWPLUG_CPU_STEP_GRAPHS=0``.
        Otherwise the integer entries of ``compilation.compile_sizes`` when it
        has any (sizes Inductor specialises for, the reference's meaning),
        else :data:`DEFAULT_STEP_GRAPH_SIZES`; either way only sizes up to
        ``scheduler.max_num_seqs`` (a decode batch has no more tokens).

        :raises ConfigError: ``HWPLUG_CPU_STEP_GRAPHS`` is not ``0`` or ``1``.
        """
        flag = os.environ.get(STEP_GRAPHS_ENV, "1").strip()
        if flag not in ("0", "1"):
            raise ConfigError(
                f"{STEP_GRAPHS_ENV}={flag!r} is not allowed: 0 (no host step graphs) or 1 "
                "(the default)"
            )
        comp = config.compilation
        compiles = (comp.level or 0) >= self.min_compiling_level and comp.backend == "inductor"
        if flag == "0" or not compiles or config.model.enforce_eager:
            return ()
        limit = config.scheduler.max_num_seqs
        given = sorted(
            {int(n) for n in comp.compile_sizes or [] if isinstance(n, int) and 0 < n <= limit},
            reverse=True,
        )
        if given:
            return tuple(given)
        return tuple(n for n in DEFAULT_STEP_GRAPH_SIZES if n <= limit)

    # -- KV cache ------------------------------------------------------------------
    def default_block_size(self, config: EngineConfig) -> int:
        """128 with IPEX, else 16."""
        return self.ipex_default_block if self.has_ipex() else self.default_block

    def supported_block_sizes(self, model_config: ModelConfig | None = None) -> tuple[int, ...]:
        """16, 32, 64, 128 with IPEX; only 16 without."""
        return self.ipex_block_sizes if self.has_ipex() else self.block_sizes

    def device_cache_dtype_problem(self, cache_dtype: str) -> str | None:
        if cache_dtype == "fp8_e4m3":
            return f"the CPU stores fp8 KV caches only as {self.fp8_format}" + (
                "" if self.has_ipex() else ", and only with intel_extension_for_pytorch"
            )
        if cache_dtype in self.ipex_cache_dtypes and not self.has_ipex():
            what = f"fp8 (= {self.fp8_format})" if cache_dtype == "fp8" else cache_dtype
            return f"an {what} KV cache needs intel_extension_for_pytorch, which is not installed"
        return None

    def cache_dtype_problem(self, cache_dtype: str, config: EngineConfig | None) -> str | None:
        """Device limits (fp8 needs IPEX and means e5m2), then conflicts with ``config``.

        With an fp8 cache, prefix caching and chunked prefill must be off.
        """
        problem = super().cache_dtype_problem(cache_dtype, config)
        if problem is not None or config is None or not is_fp8_cache(cache_dtype):
            return problem
        for path, value in (
            ("cache.enable_prefix_caching", config.cache.enable_prefix_caching),
            ("scheduler.enable_chunked_prefill", config.scheduler.enable_chunked_prefill),
        ):
            if value:
                return (
                    f"{path}=True cannot be used with cache.cache_dtype={cache_dtype!r} on "
                    f"{self.describe_device()}: the CPU attention kernels read no fp8 cache "
                    f"in that mode; set {path}=False, or use cache.cache_dtype='auto' "
                    "or 'bfloat16'"
                )
        return None

    def default_prefix_caching(self, config: EngineConfig) -> tuple[bool, str]:
        """Off with an fp8 KV cache, else on."""
        if is_fp8_cache(config.cache.cache_dtype):
            return (
                False,
                f"cache.cache_dtype={config.cache.cache_dtype!r}: no prefix caching on cpu",
            )
        return super().default_prefix_caching(config)

    def default_chunked_prefill(self, config: EngineConfig) -> tuple[bool, str]:
        """Off with an fp8 KV cache, else on."""
        if is_fp8_cache(config.cache.cache_dtype):
            return (
                False,
                f"cache.cache_dtype={config.cache.cache_dtype!r}: no chunked prefill on cpu",
            )
        return super().default_chunked_prefill(config)

    # -- model dtypes -----------------------------------------------------------------
    def model_dtype_problem(self, dtype: str, config: EngineConfig | None) -> str | None:
        """float16 models cannot be combined with an fp8 KV cache (use bfloat16)."""
        if (
            config is not None
            and canonical_dtype(dtype) == "float16"
            and is_fp8_cache(config.cache.cache_dtype)
        ):
            return model_dtype_message(
                self,
                dtype,
                f"with cache.cache_dtype={config.cache.cache_dtype!r} the CPU runs "
                "float16 models only as bfloat16",
                ["bfloat16"],
            )
        return super().model_dtype_problem(dtype, config)

    # -- KV-cache space ----------------------------------------------------------------
    def kvcache_space_bytes(self) -> tuple[int, str]:
        """Bytes for the KV cache from ``HWPLUG_CPU_KVCACHE_SPACE`` (GiB), default 4 GiB.

        Returns the bytes and where they came from; a value that is not a
        positive number raises :class:`ConfigError` naming the variable.
        """
        raw = os.environ.get(KVCACHE_SPACE_ENV, "").strip()
        if not raw:
            gib = self.default_kvcache_space_gib
            return int(gib * GiB), f"default {gib:g} GiB (set {KVCACHE_SPACE_ENV} to change it)"
        try:
            gib = float(raw)
        except ValueError:
            gib = math.nan
        space = gib * GiB
        if not math.isfinite(space) or not MIN_KVCACHE_SPACE <= space <= MAX_MEMORY:
            raise ConfigError(
                f"{KVCACHE_SPACE_ENV}={brief(raw)} is not a valid KV-cache size: it must be a "
                f"positive number of GiB from 1 MiB ({MIN_KVCACHE_SPACE / GiB}) up to "
                f"{MAX_MEMORY // GiB} (2**60 bytes), such as 4 or 0.5"
            )
        return int(space), f"{KVCACHE_SPACE_ENV}={raw} GiB"

    def kv_cache_budget_bytes(self, config: EngineConfig, used_bytes: int = 0) -> int:
        """``cache.cpu_kvcache_space_bytes`` (else the environment's): a dedicated budget.

        ``used_bytes`` does not reduce it: the space is set aside for the cache.
        """
        space = config.cache.cpu_kvcache_space_bytes
        return space if space is not None else self.kvcache_space_bytes()[0]

    def kv_cache_budget_source(self, config: EngineConfig, used_bytes: int = 0) -> tuple[str, str]:
        """The CPU's dedicated KV-cache space, raised through ``cache.cpu_kvcache_space_bytes``."""
        field = "cache.cpu_kvcache_space_bytes"
        if config.cache.cpu_kvcache_space_bytes is not None:
            return field, field
        return f"the CPU KV-cache space ({KVCACHE_SPACE_ENV})", field

    # -- configuration ----------------------------------------------------------------
    def check_and_update_config(self, config: EngineConfig, changes: ChangeLog) -> None:
        """Block size, compilation backend and custom ops, executor, KV-cache space.

        Explicit choices the CPU cannot honour raise :class:`ConfigError`: an
        fp8 cache with prefix caching or chunked prefill on, or with a float16
        model; an executor other than ``mp`` for more than one rank.
        """
        if config.cache.block_size is None:
            changes.record(
                "cache.block_size",
                self.default_block_size(config),
                "intel_extension_for_pytorch pages the cache in blocks of 128"
                if self.has_ipex()
                else "without intel_extension_for_pytorch the CPU takes block size 16 only",
            )
        super().check_and_update_config(config, changes)
        device = self.describe_device()

        problem = self.cache_dtype_problem(config.cache.cache_dtype, config)
        if problem is None:
            problem = self.model_dtype_problem(config.model.dtype, config)
        if problem is not None:
            raise ConfigError(problem)

        comp = config.compilation
        fill_unset(
            changes,
            "compilation.backend",
            self.compile_backend,
            f"{device} compiles with {self.compile_backend}",
        )
        compiles = (comp.level or 0) >= self.min_compiling_level
        if comp.use_inductor and compiles:
            fill_unset(
                changes,
                "compilation.custom_ops",
                ["none"],
                "Inductor generates the CPU kernels: custom ops off",
            )
        if comp.backend == "inductor":
            options = dict(comp.inductor_compile_config)
            added = {k: v for k, v in self.inductor_defaults.items() if k not in options}
            if added:
                changes.record(
                    "compilation.inductor_compile_config",
                    {**options, **added},
                    "Inductor on the CPU: "
                    + ", ".join(f"{k}={v}" for k, v in added.items())
                    + " (options the config left unset)",
                )
        self.apply_mla_rules(config, changes)

        world = config.parallel.world_size
        if world > 1:
            executor = config.parallel.distributed_executor_backend
            if executor is None:
                changes.record(
                    "parallel.distributed_executor_backend",
                    self.executor_backend,
                    f"{world} ranks on the CPU run as processes",
                )
            # an explicit executor (uni, mp, ray, external_launcher) is kept (platforms.md)

        if config.cache.cpu_kvcache_space_bytes is None:
            space, origin = self.kvcache_space_bytes()
            changes.record("cache.cpu_kvcache_space_bytes", space, f"KV-cache space: {origin}")

    def verify_config(self, config: EngineConfig) -> None:
        """The base checks, with the IPEX hint for block sizes other than 16."""
        block_size = config.cache.block_size
        if block_size is not None and block_size not in self.supported_block_sizes(config.model):
            allowed = ", ".join(str(b) for b in self.supported_block_sizes(config.model))
            hint = (
                ""
                if self.has_ipex()
                else "; block sizes 32, 64 and 128 need intel_extension_for_pytorch"
            )
            raise ConfigError(
                f"cache.block_size={block_size} is not supported on {self.describe_device()}; "
                f"use one of: {allowed}{hint}"
            )
        super().verify_config(config)


@hookimpl
def hwplug_platforms() -> list[type[Platform]]:
    """The built-in CPU platform."""
    return [CpuPlatform]
