"""One layer's attention call for one step, as one object.

Every layer of the attention stack (the op helper, the custom op, a
backend's ``forward`` and ``attend``, the Triton launch) takes the same
tensors and scales; :class:`AttentionCall` carries them, so each layer passes
one object on. The layer's own facts (heads, ``scale``, ``sliding_window``)
stay on the backend instance.

Importing this module does not import torch.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from hwplug.attention.metadata import AttentionMetadata, metadata_of

if TYPE_CHECKING:
    import torch

__all__ = ["AttentionCall"]


@dataclasses.dataclass(frozen=True, eq=False)
class AttentionCall:
    """The arguments of one :meth:`~hwplug.attention.AttentionBackend.forward` call.

    ``query`` ``[N, num_heads, head_size]``; ``key`` and ``value`` ``[N,
    num_kv_heads, head_size]``; the caches ``[num_blocks, block_size,
    num_kv_heads, head_size]``; ``step`` the step's
    :class:`~hwplug.attention.AttentionMetadata` or what the backend's
    ``prepare`` returned for it; ``k_scale`` and ``v_scale`` floats or 0-d
    float32 tensors (never read back to the host); ``out`` None, or a buffer
    of the query's shape and dtype the caller would like the result written
    into (a backend may use it or return a tensor of its own: callers take
    what ``attend`` returns). Compared by identity (it holds tensors); change
    a field with :func:`dataclasses.replace`.
    """

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    key_cache: torch.Tensor
    value_cache: torch.Tensor
    step: Any
    k_scale: float | torch.Tensor = 1.0
    v_scale: float | torch.Tensor = 1.0
    out: torch.Tensor | None = None

    @property
    def metadata(self) -> AttentionMetadata:
        """The step's metadata (``step`` itself, or the metadata it was prepared from)."""
        return metadata_of(self.step)
