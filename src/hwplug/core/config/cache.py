"""The KV-cache section of the engine config."""

from __future__ import annotations

import dataclasses
import hashlib
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import WithJsonSchema, field_validator
from pydantic.dataclasses import dataclass
from pydantic.json_schema import SkipJsonSchema
from pydantic_core import PydanticCustomError

from hwplug.core.config._common import (
    CONFIG,
    ConfigSection,
    Count,
    Fraction,
    NonNegativeFloat,
    PositiveInt,
    config_section,
    logger,
)
from hwplug.core.dtypes import cache_dtype_names, is_fp8_cache
from hwplug.core.errors import ConfigError

if TYPE_CHECKING:
    from hwplug.core.config.parallel import ParallelConfig

__all__ = ["CacheDType", "CacheConfig", "MambaDType", "PrefixCachingHashAlgo"]

GiB = 1 << 30

#: KV-cache storage types: a name registered in ``hwplug.core.dtypes.CACHE_DTYPE_FORMATS``
#: (``auto`` follows the model dtype, ``fp8`` is the platform's preferred fp8 format).
CacheDType = Annotated[
    str,
    WithJsonSchema({"type": "string", "enum": list(cache_dtype_names())}),
]
#: Hash algorithms for prefix-cache block hashes.
PrefixCachingHashAlgo = Literal["sha256", "sha256_cbor"]
#: Storage types of Mamba state caches.
MambaDType = Literal["auto", "float32"]

# Shares of total CPU memory the swap space may take before a warning / an error.
_SWAP_WARN_SHARE = 0.4
_SWAP_ERROR_SHARE = 0.7


@config_section
@dataclass(config=CONFIG)
class CacheConfig(ConfigSection):
    """How the KV cache is laid out, sized and hashed."""

    section = "cache"

    block_size: PositiveInt | None = None
    """Tokens per cache block; ``None`` lets the platform choose (it checks what it allows)."""
    gpu_memory_utilization: Fraction = 0.9
    """Share of device memory, in (0, 1], this engine instance may use."""
    swap_space: NonNegativeFloat = 4
    """CPU swap space per device, in GiB."""
    cache_dtype: CacheDType = "auto"
    """Storage type of the KV cache; ``auto`` uses the model dtype."""
    is_attention_free: bool = False
    """Whether the model has no attention (copied from the model section)."""
    num_gpu_blocks_override: Count | None = None
    """Use exactly this many device blocks instead of the profiled number."""
    sliding_window: PositiveInt | None = None
    """Sliding attention window in tokens (copied from the model section)."""
    enable_prefix_caching: bool | None = None
    """Reuse cached blocks of shared prefixes; ``None`` lets the platform decide."""
    prefix_caching_hash_algo: PrefixCachingHashAlgo = "sha256"
    """Block hash: ``sha256`` over pickle, or ``sha256_cbor`` over canonical CBOR."""
    cpu_offload_gb: NonNegativeFloat = 0
    """GiB of model weights per device kept in CPU memory and streamed in."""
    calculate_kv_scales: bool = False
    """Compute fp8 KV scales from the data instead of loading them (default 1.0)."""
    cpu_kvcache_space_bytes: Count | None = None
    """KV-cache budget in bytes on the CPU platform; ``None`` lets it decide."""
    mamba_page_size_padded: Count | None = None
    """Padded Mamba page size, to align hybrid models with the attention page size."""
    mamba_cache_dtype: MambaDType = "auto"
    """Storage type of the Mamba conv and SSM state; ``auto`` follows the model."""
    mamba_ssm_cache_dtype: MambaDType = "auto"
    """Storage type of the Mamba SSM state only; ``auto`` follows ``mamba_cache_dtype``."""
    num_gpu_blocks: SkipJsonSchema[Count | None] = dataclasses.field(
        default=None, init=False, compare=False
    )
    """Device blocks allocated (set after profiling, not by users)."""
    num_cpu_blocks: SkipJsonSchema[Count | None] = dataclasses.field(
        default=None, init=False, compare=False
    )
    """CPU blocks allocated (set after profiling, not by users)."""
    kv_sharing_fast_prefill: bool = False
    """Let eligible KV-sharing layers skip prefill tokens (experimental)."""
    kv_cache_memory_bytes: Count | None = None
    """KV-cache budget per device in bytes; overrides ``gpu_memory_utilization``."""

    @field_validator("cache_dtype", mode="before")
    @classmethod
    def _check_cache_dtype(cls, value: Any) -> Any:
        names = cache_dtype_names()
        if isinstance(value, str) and value in names:
            return value
        expected = ", ".join(repr(n) for n in names[:-1]) + f" or {names[-1]!r}"
        # As pydantic words a Literal's error: the allowed set is the registry's.
        raise PydanticCustomError(
            "literal_error", "Input should be {expected}", {"expected": expected}
        )

    def __post_init__(self) -> None:
        if is_fp8_cache(self.cache_dtype):
            logger.info(
                "KV cache stored as %s: less memory and more speed, but accuracy may drop "
                "without proper scaling factors",
                self.cache_dtype,
            )

    @property
    def swap_space_bytes(self) -> float:
        """``swap_space`` in bytes (follows ``swap_space`` when it is assigned)."""
        return self.swap_space * GiB

    def compute_hash(self) -> str:
        """MD5 hex digest of the fields that change the compiled graph (the dtypes)."""
        factors: list[Any] = [self.cache_dtype, self.mamba_cache_dtype, self.mamba_ssm_cache_dtype]
        return hashlib.md5(str(factors).encode(), usedforsecurity=False).hexdigest()

    def metrics_info(self) -> dict[str, str]:
        """Every attribute, derived ones included, as strings (for metrics labels)."""
        info = {f.name: str(getattr(self, f.name)) for f in dataclasses.fields(self)}
        info["swap_space_bytes"] = str(self.swap_space_bytes)
        return info

    def verify_with_parallel_config(self, parallel_config: ParallelConfig) -> None:
        """Check the swap space of one node's tensor-parallel ranks against CPU memory.

        Over 40% of the total CPU memory logs a warning; over 70% is an error.

        :raises ConfigError: the swap space takes more than 70% of CPU memory.
        """
        import psutil

        total = psutil.virtual_memory().total
        # The tensor-parallel ranks are assumed to share a node.
        used = self.swap_space_bytes * parallel_config.tensor_parallel_size
        summary = (
            f"{used / GiB:.2f} GiB (cache.swap_space={self.swap_space} GiB x "
            f"parallel.tensor_parallel_size={parallel_config.tensor_parallel_size}) of the "
            f"{total / GiB:.2f} GiB total CPU memory is allocated for the swap space"
        )
        if used > _SWAP_ERROR_SHARE * total:
            raise ConfigError(
                f"cache.swap_space is too large: {summary}; at most "
                f"{int(_SWAP_ERROR_SHARE * 100)}% is allowed, lower cache.swap_space"
            )
        if used > _SWAP_WARN_SHARE * total:
            logger.warning("cache.swap_space is possibly too large: %s", summary)
