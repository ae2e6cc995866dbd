"""The ``hwplug::unified_attention`` custom op and the helper engines call.

Attention runs through one registered torch custom op so that
``torch.compile`` sees it as one opaque call: piecewise compilation splits the
graph there (``splitting_ops=["hwplug.unified_attention"]``) and the backend
runs eagerly (or inside a CUDA graph) between the compiled pieces.

The op is registered on first use, never when hwplug is imported: this
module imports torch only inside its functions.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from hwplug.attention.base import check_scale
from hwplug.attention.call import AttentionCall
from hwplug.attention.context import forward_context
from hwplug.attention.metadata import AttentionMetadata, PreparedStep

if TYPE_CHECKING:
    import torch

__all__ = ["OP_NAME", "OP_WITH_OUTPUT_NAME", "register_unified_attention", "unified_attention"]

OP_NAME = "hwplug::unified_attention"
"""The custom op's qualified name (``hwplug.unified_attention`` in splitting ops)."""
OP_WITH_OUTPUT_NAME = "hwplug::unified_attention_with_output"
"""The variant that writes into an output buffer (``unified_attention(..., out=buffer)``)."""

_op: Any = None


def register_unified_attention() -> Any:
    """Register ``hwplug::unified_attention`` (once per process; imports torch).

    Returns ``torch.ops.hwplug.unified_attention``, called as ``op(query, key,
    value, key_cache, value_cache, query_start_loc, seq_lens, block_table,
    slot_mapping, k_scale, v_scale, backend, scale, sliding_window)`` with the
    scales as 0-d float32 tensors, ``backend`` a backend name and
    ``sliding_window`` an int or None. It mutates the two caches and returns
    a new ``[N, num_heads, head_size]`` tensor.
    """
    global _op
    if _op is None:
        # lazy: torch; `import hwplug` (which lists the backends) stays light
        from hwplug.attention import _unified_op

        _op = _unified_op.OP
    return _op


def unified_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    metadata: AttentionMetadata | PreparedStep,
    *,
    backend: str,
    scale: float,
    sliding_window: int | None = None,
    k_scale: float | torch.Tensor = 1.0,
    v_scale: float | torch.Tensor = 1.0,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of one layer for one step, through the ``hwplug::unified_attention`` op.

    The same arguments and semantics as :meth:`AttentionBackend.forward`, with
    the backend named by ``backend`` (see :func:`hwplug.attention.get_backend`)
    and built for the heads of ``query`` and ``key``, ``scale``,
    ``sliding_window`` and the caches' dtype. Float scales are checked as
    ``forward`` checks them (positive and finite) and become 0-d tensors on
    the query's device (a fill, not a host-to-device copy).

    :raises ValueError: a scale that is not a positive finite float or a 0-d
        float32 tensor.

    ``metadata`` is the step's :class:`AttentionMetadata` (inside the engine's
    :func:`~hwplug.attention.forward_context`, the op finds the step the
    engine prepared for it), or a prepared step itself (for eager callers:
    it is made the op's context for the call).

    With ``out`` (a tensor of the query's shape, made by the code before the
    call, such as ``torch.empty_like(query)``) the result is written there
    through ``hwplug::unified_attention_with_output`` and ``out`` is returned:
    under piecewise graphs the piece after attention then reads the same
    memory on every replay, as the graph it was captured with expects.
    """
    # lazy: the custom op imports torch; `import hwplug` stays light. (Not through the
    # `_op` global: under torch.compile a check of it would become a guard that fails
    # once tracing has registered the op, and compile the model a second time.)
    from hwplug.attention._unified_op import OP, OP_WITH_OUTPUT, op_arguments

    # A float scale becomes a tensor here, past forward()'s own check: check it first.
    check_scale("k_scale", k_scale, query)
    check_scale("v_scale", v_scale, query)
    call = AttentionCall(query, key, value, key_cache, value_cache, metadata, k_scale, v_scale)
    with contextlib.ExitStack() as stack:
        if isinstance(metadata, PreparedStep):
            stack.enter_context(forward_context(metadata))
        layer = (backend, float(scale), sliding_window)
        if out is None:
            result: torch.Tensor = OP(*op_arguments(call), *layer)
            return result
        tensors = op_arguments(call)
        OP_WITH_OUTPUT(*tensors[:3], out, *tensors[3:], *layer)
        return out
