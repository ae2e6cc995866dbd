"""Registration of the ``hwplug::unified_attention`` torch custom op.

Importing this module imports torch and registers the op; :mod:`hwplug.attention.ops`
imports it on first use. (No ``from __future__ import annotations`` here:
``torch.library`` reads the signature's annotations to build the schema.)
"""

import torch

from hwplug.attention.base import AttentionBackend
from hwplug.attention.context import step_for
from hwplug.attention.metadata import AttentionMetadata
from hwplug.attention.registry import get_backend

__all__ = [
    "OP",
    "OP_WITH_OUTPUT",
    "as_scale_tensor",
    "unified_attention_op",
    "unified_attention_with_output_op",
]


_MAX_INSTANCES = 256
"""Backend instances kept (one per layer shape; a model has a handful)."""

_instances: dict[tuple[object, ...], AttentionBackend] = {}


def _backend(
    name: str,
    num_heads: int,
    head_size: int,
    num_kv_heads: int,
    scale: float,
    sliding_window: int | None,
    cache_dtype: torch.dtype,
) -> AttentionBackend:
    """One backend instance per backend class and layer shape (construction validates,
    so do it once).

    The name is looked up in the active session's table on every call (a dict
    lookup, cached by the session until its plugins change), so the op follows
    the session: a backend whose plugin is gone is an unknown name.
    """
    cls = get_backend(name)
    key = (cls, num_heads, head_size, num_kv_heads, scale, sliding_window, cache_dtype)
    impl = _instances.get(key)
    if impl is None:
        impl = cls(
            num_heads,
            head_size,
            num_kv_heads,
            scale,
            sliding_window=sliding_window,
            cache_dtype=cache_dtype,
        )
        if len(_instances) >= _MAX_INSTANCES:
            _instances.clear()
        _instances[key] = impl
    return impl


@torch.library.custom_op("hwplug::unified_attention", mutates_args=("key_cache", "value_cache"))
def unified_attention_op(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    backend: str,
    scale: float,
    sliding_window: int | None,
) -> torch.Tensor:
    """Write the step's keys and values, then attend, with the backend called ``backend``."""
    if query.dim() != 3 or key.dim() != 3:
        raise ValueError(
            "hwplug::unified_attention: query must be [num_tokens, num_heads, head_size] and "
            f"key [num_tokens, num_kv_heads, head_size]; got {list(query.shape)} and "
            f"{list(key.shape)}"
        )
    impl = _backend(
        backend,
        query.shape[1],
        query.shape[2],
        key.shape[1],
        scale,
        sliding_window,
        key_cache.dtype,
    )
    # the step the engine prepared (forward_context), when it is this step's metadata
    step = step_for(query_start_loc, seq_lens, block_table, slot_mapping)
    if step is None:
        step = AttentionMetadata(query_start_loc, seq_lens, block_table, slot_mapping)
    return impl.forward(
        query, key, value, key_cache, value_cache, step, k_scale=k_scale, v_scale=v_scale
    )


@unified_attention_op.register_fake
def _(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    backend: str,
    scale: float,
    sliding_window: int | None,
) -> torch.Tensor:
    return torch.empty_like(query)


@torch.library.custom_op(
    "hwplug::unified_attention_with_output",
    mutates_args=("output", "key_cache", "value_cache"),
)
def unified_attention_with_output_op(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    output: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    backend: str,
    scale: float,
    sliding_window: int | None,
) -> None:
    """As ``hwplug::unified_attention``, writing the result into ``output``.

    The buffer comes from the code before the op (inside the compiled piece),
    so under piecewise graphs the piece after it always reads the same memory.
    """
    if output.shape != query.shape:
        raise ValueError(
            "hwplug::unified_attention_with_output: output must have the query's shape "
            f"{list(query.shape)}; got {list(output.shape)}"
        )
    output.copy_(
        unified_attention_op(
            query,
            key,
            value,
            key_cache,
            value_cache,
            query_start_loc,
            seq_lens,
            block_table,
            slot_mapping,
            k_scale,
            v_scale,
            backend,
            scale,
            sliding_window,
        )
    )


OP = torch.ops.hwplug.unified_attention
"""``torch.ops.hwplug.unified_attention``: what traced graphs call."""
OP_WITH_OUTPUT = torch.ops.hwplug.unified_attention_with_output
"""``torch.ops.hwplug.unified_attention_with_output``: the variant that writes into a buffer."""


def as_scale_tensor(scale: "float | torch.Tensor", like: torch.Tensor) -> torch.Tensor:
    """A scale as the op takes it: a 0-d float32 tensor (floats are filled on ``like``'s device)."""
    if isinstance(scale, torch.Tensor):
        return scale
    return torch.full((), float(scale), dtype=torch.float32, device=like.device)
