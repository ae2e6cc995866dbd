"""How the model's layers reach hwplug's attention.

The resolved config names an attention backend (``attention.backend``);
:func:`make_layer` builds that backend's implementation for one layer and
registers it, with the layer's KV cache, under the layer's key. The model
calls :func:`attention` with its query, key and value; the call goes through
one custom op, opaque to ``torch.compile`` (piecewise compilation splits the
graph there), which looks the layer up and runs the backend on the step's
:class:`~hwplug.attention.AttentionMetadata` (set by the runner in a
:class:`StepContext`).

The op writes into an output tensor made before it: in a piecewise graph that
tensor belongs to the preceding piece, so its address is stable across graph
replays and the next piece reads what attention wrote.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import torch

__all__ = [
    "LayerState",
    "StepContext",
    "attention",
    "backend_class",
    "make_layer",
    "release_layers",
]


@dataclasses.dataclass
class StepContext:
    """The attention metadata of the step being run, shared by every layer of one engine.

    ``metadata`` is None while the engine profiles memory before its KV cache
    exists (attention then writes zeros).
    """

    metadata: Any = None
    num_tokens: int = 0
    """Real (unpadded) tokens of the step."""


@dataclasses.dataclass
class LayerState:
    """One layer's backend implementation, KV cache and fp8 scales."""

    impl: Any
    context: StepContext
    key_cache: torch.Tensor | None = None
    value_cache: torch.Tensor | None = None
    k_scale: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None
    scales_pending: bool = False
    """fp8 with ``cache.calculate_kv_scales``: scales come from the first real step."""


_LAYERS: dict[str, LayerState] = {}
_ENGINE_IDS = itertools.count()


def backend_class(name: str) -> type:
    """The hwplug attention backend class called ``name``.

    :raises hwplug.ConfigError: an unknown name (the message lists the known ones).
    """
    from hwplug.attention import get_backend

    return get_backend(name)


def make_layer(
    backend: type,
    context: StepContext,
    *,
    num_heads: int,
    head_size: int,
    num_kv_heads: int,
    sliding_window: int | None,
    cache_dtype: torch.dtype,
    engine_id: int | None = None,
    layer: int = 0,
) -> str:
    """Build and register one layer's attention; returns its key."""
    impl = backend(
        num_heads,
        head_size,
        num_kv_heads,
        head_size**-0.5,
        sliding_window=sliding_window,
        cache_dtype=cache_dtype,
    )
    key = f"engine{engine_id if engine_id is not None else next(_ENGINE_IDS)}.layer{layer}"
    _LAYERS[key] = LayerState(impl=impl, context=context)
    return key


def new_engine_id() -> int:
    """A number that keeps one engine's layer keys apart from another's."""
    return next(_ENGINE_IDS)


def layer_state(key: str) -> LayerState:
    """The registered state of layer ``key``."""
    return _LAYERS[key]


def release_layers(keys: list[str]) -> None:
    """Forget the layers of an engine that is going away (frees their caches)."""
    for key in keys:
        _LAYERS.pop(key, None)


@torch.library.custom_op("tiny_engine::attention", mutates_args=("output",))
def _attention_op(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, output: torch.Tensor, layer: str
) -> None:
    state = _LAYERS[layer]
    metadata = state.context.metadata
    if metadata is None or state.key_cache is None or state.value_cache is None:
        output.zero_()
        return
    if state.scales_pending and state.k_scale is not None and state.v_scale is not None:
        from hwplug.kernels import compute_kv_scales

        real = state.context.num_tokens
        k_scale, v_scale = compute_kv_scales(key[:real], value[:real], state.key_cache.dtype)
        state.k_scale.copy_(k_scale)
        state.v_scale.copy_(v_scale)
        state.scales_pending = False
    out = state.impl.forward(
        query,
        key,
        value,
        state.key_cache,
        state.value_cache,
        metadata,
        k_scale=1.0 if state.k_scale is None else state.k_scale,
        v_scale=1.0 if state.v_scale is None else state.v_scale,
    )
    output.copy_(out)


@_attention_op.register_fake
def _(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, output: torch.Tensor, layer: str
) -> None:
    return None


def attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layer: str
) -> torch.Tensor:
    """Paged attention of one layer for the current step: ``[num_tokens, heads, head_size]``."""
    output = torch.empty_like(query)
    torch.ops.tiny_engine.attention(query, key, value, output, layer)
    return output
