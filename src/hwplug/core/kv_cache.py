"""KV-cache dtypes, page sizes, block budgets and prefix-cache block hashes.

Nothing here knows a particular chip: the platform answers what ``fp8`` means
(:meth:`Platform.fp8_dtype`) and how many bytes the cache may take
(:meth:`Platform.kv_cache_budget_bytes`). torch is imported only by the
functions that return torch dtypes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import operator
import pickle
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from hwplug.core.dtypes import cache_dtype_names
from hwplug.core.errors import ConfigError

if TYPE_CHECKING:
    import torch

    from hwplug.core.config import EngineConfig
    from hwplug.core.platform import Platform

__all__ = [
    "CACHE_DTYPES",
    "HASH_ALGORITHMS",
    "STR_DTYPE_TO_TORCH_DTYPE",
    "KVCacheSpec",
    "cache_dtype_to_torch",
    "hash_block_tokens",
    "hash_function",
    "needs_memory_profile",
    "num_blocks",
]

GiB = 1 << 30

CACHE_DTYPES: tuple[str, ...] = cache_dtype_names()
"""The built-in ``cache.cache_dtype`` strings (the registry is
:data:`hwplug.core.dtypes.CACHE_DTYPE_FORMATS`)."""

HASH_ALGORITHMS: tuple[str, ...] = ("sha256", "sha256_cbor")
"""The ``cache.prefix_caching_hash_algo`` names."""

# pickle's format differs between protocols: pin one so digests stay put
_PICKLE_PROTOCOL = 5

# Model-dtype spellings -> torch dtype attribute names.
_MODEL_DTYPE_NAMES: dict[str, str] = {
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "float32": "float32",
    "fp32": "float32",
    "float": "float32",
}


class _DtypeTable(Mapping[str, "torch.dtype"]):
    """A read-only ``str -> torch.dtype`` table that imports torch on first lookup."""

    def __init__(self, names: Mapping[str, str]) -> None:
        self._names = dict(names)

    def __getitem__(self, key: str) -> torch.dtype:
        import torch

        dtype = getattr(torch, self._names[key])
        assert isinstance(dtype, torch.dtype)  # the table only names real dtypes
        return dtype

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __repr__(self) -> str:
        return f"STR_DTYPE_TO_TORCH_DTYPE({self._names!r})"


STR_DTYPE_TO_TORCH_DTYPE: Mapping[str, torch.dtype] = _DtypeTable(_MODEL_DTYPE_NAMES)
"""Model-dtype strings (and their aliases ``bf16``, ``half``, ``fp32``...) to torch dtypes.

torch is imported on the first lookup, not when this module is imported.
"""


def _model_dtype(model_dtype: object, platform: Platform) -> torch.dtype:
    import torch

    if isinstance(model_dtype, torch.dtype):
        if model_dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise ConfigError(
                f"model.dtype={model_dtype} cannot be a KV-cache dtype; "
                "use bfloat16, float16 or float32"
            )
        return model_dtype
    text = str(model_dtype).strip().lower().removeprefix("torch.")
    if text == "auto":
        text = platform.supported_model_dtypes()[0]
    if text not in _MODEL_DTYPE_NAMES:
        raise ConfigError(
            f"model.dtype={model_dtype!r} is not a model dtype; use one of: auto, "
            f"{', '.join(_MODEL_DTYPE_NAMES)}"
        )
    return STR_DTYPE_TO_TORCH_DTYPE[text]


def cache_dtype_to_torch(
    cache_dtype: str, model_dtype: str | torch.dtype, platform: Platform
) -> torch.dtype:
    """The torch dtype a ``cache.cache_dtype`` string stores on ``platform``.

    ``auto`` follows the model dtype (``auto`` there means the platform's first
    supported model dtype); every other string is mapped by the platform
    (:meth:`~hwplug.core.platform.Platform.cache_dtype_torch_name`): ``fp8`` is
    its :meth:`~hwplug.core.platform.Platform.fp8_dtype`, ``fp8_e4m3`` is
    ``float8_e4m3fnuz`` where the platform uses the FNUZ encoding, else
    ``float8_e4m3fn``, ``fp8_e5m2`` is ``float8_e5m2``.

    This maps names; whether the device can store the dtype is the platform's
    verdict (:meth:`~hwplug.core.platform.Platform.is_kv_cache_dtype_supported`).

    :raises ConfigError: an unknown string, a format the platform lacks, or a
        model dtype that is not one.
    """
    import torch

    if cache_dtype == "auto":
        return _model_dtype(model_dtype, platform)
    dtype = getattr(torch, platform.cache_dtype_torch_name(cache_dtype))
    assert isinstance(dtype, torch.dtype)
    return dtype


def _resolve_dtype(dtype: object) -> torch.dtype:
    import torch

    if isinstance(dtype, torch.dtype) and dtype.is_floating_point:
        return dtype
    if isinstance(dtype, str):
        text = dtype.strip().removeprefix("torch.")
        name = _MODEL_DTYPE_NAMES.get(text.lower(), text)
        candidate = getattr(torch, name, None)
        if isinstance(candidate, torch.dtype) and candidate.is_floating_point:
            return candidate
    raise ConfigError(
        f"KVCacheSpec.dtype must be a floating-point torch.dtype or its name (such as "
        f"'bfloat16' or 'float8_e4m3fn'); got {dtype!r}"
    )


@dataclasses.dataclass(frozen=True)
class KVCacheSpec:
    """The shape of the KV cache of one device: what one block of tokens costs.

    ``num_layers`` attention layers each keep a key and a value tensor of
    ``num_kv_heads x head_size`` per token, paged in blocks of ``block_size``
    tokens, stored as ``dtype`` (a ``torch.dtype`` or its name). For MLA models
    (``use_mla``) each layer keeps one latent tensor instead: ``head_size`` is
    then the latent width per token (``kv_lora_rank + qk_rope_head_dim``) and
    ``num_kv_heads`` is 1. ``sliding_window`` (tokens), when set, bounds how
    much of a sequence the cache must hold.
    """

    num_layers: int
    num_kv_heads: int
    head_size: int
    block_size: int
    dtype: torch.dtype
    use_mla: bool = False
    sliding_window: int | None = None

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_kv_heads", "head_size", "block_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"KVCacheSpec.{name} must be a positive integer; got {value!r}")
        window = self.sliding_window
        if window is not None and (
            isinstance(window, bool) or not isinstance(window, int) or window < 1
        ):
            raise ConfigError(
                f"KVCacheSpec.sliding_window must be a positive integer or None; got {window!r}"
            )
        if self.use_mla and self.num_kv_heads != 1:
            raise ConfigError(
                "KVCacheSpec.num_kv_heads must be 1 with use_mla=True (one latent per token); "
                f"got {self.num_kv_heads}"
            )
        object.__setattr__(self, "dtype", _resolve_dtype(self.dtype))

    @property
    def itemsize(self) -> int:
        """Bytes per stored element."""
        return int(self.dtype.itemsize)

    @property
    def tensors_per_layer(self) -> int:
        """2 (a key and a value tensor), or 1 for MLA's single latent tensor."""
        return 1 if self.use_mla else 2

    @property
    def page_size_bytes(self) -> int:
        """Bytes of one block in one layer: K and V (``2 x block_size x num_kv_heads x
        head_size x itemsize``), or the one MLA latent."""
        per_token = self.tensors_per_layer * self.num_kv_heads * self.head_size
        return self.block_size * per_token * self.itemsize

    @property
    def bytes_per_block(self) -> int:
        """Bytes of one block across all layers."""
        return self.num_layers * self.page_size_bytes

    def tokens_per_sequence(self, max_model_len: int, max_num_batched_tokens: int = 1) -> int:
        """Tokens of one ``max_model_len`` sequence the cache must hold at once.

        With a sliding window, a step that adds up to ``max_num_batched_tokens``
        tokens still needs the ``sliding_window - 1`` before them:
        ``min(max_model_len, sliding_window - 1 + max_num_batched_tokens)``.
        """
        if self.sliding_window is None:
            return max_model_len
        return min(max_model_len, self.sliding_window - 1 + max_num_batched_tokens)

    def blocks_per_sequence(self, max_model_len: int, max_num_batched_tokens: int = 1) -> int:
        """Blocks one ``max_model_len`` sequence needs: its tokens rounded up to blocks,
        plus one block with a sliding window (the window rarely starts on a block edge)."""
        tokens = self.tokens_per_sequence(max_model_len, max_num_batched_tokens)
        extra = 0 if self.sliding_window is None else 1
        return math.ceil(tokens / self.block_size) + extra

    @classmethod
    def from_config(cls, config: EngineConfig, platform: Platform) -> KVCacheSpec:
        """The spec of one device for a (resolved) engine config.

        Takes ``model.num_layers`` (split across ``parallel.pipeline_parallel_size``
        stages: the largest stage's share), ``model.num_kv_heads`` divided by
        ``parallel.tensor_parallel_size`` (at least 1), ``model.head_size``,
        ``cache.block_size`` and the dtype of ``cache.cache_dtype`` on
        ``platform``. MLA models (``model.use_mla``) cache one latent of
        ``kv_lora_rank + qk_rope_head_dim`` per token, not split by tensor
        parallelism.

        An unresolved config (``cache.block_size`` unset) takes the
        platform's default block size, as :func:`hwplug.resolve` would.

        :raises ConfigError: the model has no attention, or the cache dtype
            cannot be mapped.
        """
        model, cache, parallel = config.model, config.cache, config.parallel
        block_size = cache.block_size
        if block_size is None:
            block_size = platform.default_block_size(config)
        if model.is_attention_free or cache.is_attention_free:
            raise ConfigError(
                "model.is_attention_free=True: an attention-free model has no KV cache"
            )
        dtype = cache_dtype_to_torch(cache.cache_dtype, model.dtype, platform)
        num_layers = math.ceil(model.num_layers / parallel.pipeline_parallel_size)
        if model.use_mla:
            heads, head_size = 1, model.kv_lora_rank + model.qk_rope_head_dim
        else:
            heads = max(1, model.num_kv_heads // parallel.tensor_parallel_size)
            head_size = model.head_size
        window = model.sliding_window if model.sliding_window is not None else cache.sliding_window
        return cls(
            num_layers=num_layers,
            num_kv_heads=heads,
            head_size=head_size,
            block_size=block_size,
            dtype=dtype,
            use_mla=model.use_mla,
            sliding_window=window,
        )


def _size(nbytes: int) -> str:
    return f"{nbytes / GiB:.2f} GiB ({nbytes} bytes)"


def needs_memory_profile(config: EngineConfig, platform: Platform) -> bool:
    """Whether :func:`num_blocks` depends on ``used_bytes`` for this config.

    It does only when the budget comes from the platform and the platform's
    budget is reduced by what is in use (``Platform.kv_cache_budget_bytes``,
    ``Platform.kv_budget_counts_memory_in_use``). Otherwise an engine can size
    its cache without a profile run of its largest step: with
    ``cache.num_gpu_blocks_override`` or ``cache.kv_cache_memory_bytes`` set,
    for an attention-free model, and on the CPU (a dedicated KV space).
    """
    cache = config.cache
    if cache.num_gpu_blocks_override is not None or cache.kv_cache_memory_bytes is not None:
        return False
    if config.model.is_attention_free or cache.is_attention_free:
        return False
    return bool(platform.kv_budget_counts_memory_in_use)


def num_blocks(config: EngineConfig, platform: Platform, used_bytes: int = 0) -> int:
    """How many KV-cache blocks fit on one device.

    ``cache.num_gpu_blocks_override``, when set, is returned as it is, unchecked.
    Otherwise the budget is ``cache.kv_cache_memory_bytes`` when set (on any
    platform), else :meth:`Platform.kv_cache_budget_bytes` (by default
    ``cache.gpu_memory_utilization`` x the device's total memory minus
    ``used_bytes``, what weights and activations already take; on CPU
    ``cache.cpu_kvcache_space_bytes``). The result is budget //
    :attr:`KVCacheSpec.bytes_per_block`. An attention-free model needs no blocks: 0.

    :raises ConfigError: the budget cannot hold one ``model.max_model_len``
        sequence (the message gives both sizes in GiB and bytes).
    :raises ValueError: ``used_bytes`` is not a non-negative integer.
    """
    cache = config.cache
    if cache.num_gpu_blocks_override is not None:
        return cache.num_gpu_blocks_override
    if isinstance(used_bytes, bool) or not isinstance(used_bytes, int) or used_bytes < 0:
        raise ValueError(f"used_bytes must be a non-negative integer; got {used_bytes!r}")
    if config.model.is_attention_free or cache.is_attention_free:
        return 0
    spec = KVCacheSpec.from_config(config, platform)
    if cache.kv_cache_memory_bytes is not None:
        budget = cache.kv_cache_memory_bytes
        source = remedy = "cache.kv_cache_memory_bytes"
    else:
        budget = platform.kv_cache_budget_bytes(config, used_bytes)
        source, remedy = platform.kv_cache_budget_source(config, used_bytes)
    blocks = max(budget, 0) // spec.bytes_per_block
    step = config.scheduler.max_num_batched_tokens
    needed_blocks = spec.blocks_per_sequence(config.model.max_model_len, step)
    if blocks < needed_blocks:
        tokens = spec.tokens_per_sequence(config.model.max_model_len, step)
        window = (
            f" (sliding window {spec.sliding_window} - 1 + scheduler.max_num_batched_tokens "
            f"{step}, plus one block)"
            if spec.sliding_window is not None
            else ""
        )
        raise ConfigError(
            f"the KV cache on {platform.describe_device()} cannot hold one sequence of "
            f"model.max_model_len={config.model.max_model_len} tokens: {tokens} tokens"
            f"{window} need {needed_blocks} blocks of {spec.block_size} tokens = "
            f"{_size(needed_blocks * spec.bytes_per_block)}, but there is "
            f"{_size(max(budget, 0))} ({source}); raise {remedy}, lower "
            "model.max_model_len, or store the cache in fp8 (cache.cache_dtype)"
        )
    return blocks


# -- prefix-cache block hashes ------------------------------------------------------------


def _sha256_pickle(obj: Any) -> bytes:
    try:
        payload = pickle.dumps(obj, protocol=_PICKLE_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError) as exc:
        raise ValueError(f"sha256 cannot hash a {type(obj).__name__}: {exc}") from exc
    return hashlib.sha256(payload).digest()


def _sha256_cbor(obj: Any) -> bytes:
    import cbor2

    try:
        payload = cbor2.dumps(obj, canonical=True)
    except (cbor2.CBOREncodeError, TypeError, ValueError) as exc:
        raise ValueError(
            f"sha256_cbor hashes only CBOR-encodable values (None, bool, int, float, str, "
            f"bytes, tuples, lists, dicts); got {type(obj).__name__}: {exc}"
        ) from exc
    return hashlib.sha256(payload).digest()


_HASHERS: dict[str, Callable[[Any], bytes]] = {
    "sha256": _sha256_pickle,
    "sha256_cbor": _sha256_cbor,
}


def hash_function(algo: str) -> Callable[[Any], bytes]:
    """The ``obj -> bytes`` digest for ``cache.prefix_caching_hash_algo``.

    ``sha256``: SHA-256 of the object pickled with protocol 5 (stable for a
    given Python and the object's types). ``sha256_cbor``: SHA-256 of the
    canonical CBOR encoding, the same in every process, on every machine and
    under every Python version.

    :raises ConfigError: an unknown algorithm (the message lists both).
    """
    try:
        return _HASHERS[algo]
    except (KeyError, TypeError):
        raise ConfigError(
            f"cache.prefix_caching_hash_algo={algo!r} is not a hash algorithm; use one of: "
            f"{', '.join(HASH_ALGORITHMS)}"
        ) from None


def hash_block_tokens(
    hash_fn: Callable[[Any], bytes],
    parent_hash: bytes | None,
    token_ids: Iterable[int],
    extra_keys: tuple[Any, ...] | list[Any] | None = None,
) -> bytes:
    """The hash of one full block, chained to the block before it.

    Hashes ``(parent_hash, tuple(token_ids), extra_keys)`` with ``hash_fn``;
    ``parent_hash`` is None for a sequence's first block. Equal prefixes thus
    give equal hashes block by block, and a block's hash depends on everything
    before it. ``extra_keys`` (LoRA ids, multimodal hashes, cache salts) is
    hashed as a tuple.
    """
    try:
        tokens = tuple(operator.index(t) for t in token_ids)
    except TypeError:
        raise ValueError(f"token_ids must be integers; got {token_ids!r}") from None
    if extra_keys is None or isinstance(extra_keys, tuple):
        extra = extra_keys
    elif isinstance(extra_keys, list):
        extra = tuple(extra_keys)
    else:
        raise ValueError(
            f"extra_keys must be a tuple (or list) of values, or None; got "
            f"{type(extra_keys).__name__}"
        )
    return hash_fn((parent_hash, tokens, extra))
