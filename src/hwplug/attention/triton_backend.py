"""The ``triton`` attention backend: one Triton kernel for every kind of batch.

Prefill, chunked prefill, decode and mixed batches run through one kernel
that reads the paged cache directly (see :mod:`hwplug.attention._triton_unified`).
Nothing in the forward reads a tensor value back to the host, and its launch
depends on shapes alone, so it can be captured in a full CUDA graph
(``graph_support = ALWAYS``). Its ``prepare`` is the default one: the step's
values are checked once, from the metadata's host values, and the metadata
itself is what every layer takes.

Limits: the devices of platforms that run Triton (``runs_triton``: CUDA,
ROCm and XPU among the built-ins); head sizes
that are multiples of 16 from 32 to 256 (padded to a power of two inside the
kernel); any block size; bfloat16, float16 and float32 models; caches in
those dtypes or fp8 (``float8_e4m3fn``, ``float8_e4m3fnuz``, ``float8_e5m2``,
``float8_e5m2fnuz``); not MLA. On CPU tensors it runs only in Triton's
interpreter (``TRITON_INTERPRET=1``), which is how the tests run it.

This module does not import torch or triton; :meth:`attend` does.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from hwplug.attention.base import AttentionBackend
from hwplug.core.graphs import AttentionGraphSupport

if TYPE_CHECKING:
    import torch

    from hwplug.attention.call import AttentionCall

__all__ = ["TritonAttentionBackend"]

_TRUE_WORDS = frozenset({"1", "true", "yes", "on", "y"})


def _interpret_requested() -> bool:
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in _TRUE_WORDS


class TritonAttentionBackend(AttentionBackend):
    """Paged attention in one Triton kernel; capturable in full CUDA graphs."""

    name = "triton"
    graph_support = AttentionGraphSupport.ALWAYS
    uses_triton = True  # the platforms that run Triton: CUDA, ROCm, XPU among the built-ins
    head_sizes = range(32, 257, 16)
    model_dtypes = ("bfloat16", "float16", "float32")
    cache_dtypes = ("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2")

    def attend(self, call: AttentionCall) -> torch.Tensor:
        # lazy: torch; `import hwplug` (which lists the backends) stays light
        from hwplug.core.session import platform_for_device
        from hwplug.kernels import triton_unavailable_reason

        device = call.query.device
        platform = platform_for_device(device.type) if device.type != "cpu" else None
        reason = triton_unavailable_reason(
            device, runs_triton=None if platform is None else platform.runs_triton
        )
        if reason is not None:
            raise RuntimeError(f"the triton attention backend cannot run here: {reason}")
        # lazy: torch and triton; `import hwplug` (which lists the backends) stays light
        from hwplug.attention import _triton_unified

        return _triton_unified.unified_attention(
            call,
            scale=self.scale,
            sliding_window=self.sliding_window,
            interpret=_interpret_requested(),
        )
