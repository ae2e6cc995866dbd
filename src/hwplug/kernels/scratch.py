"""Per-thread scratch buffers that kernels reuse call after call.

A fresh multi-megabyte tensor per call would be mapped and faulted in by the
allocator again and again; these stay mapped. The torch attention backend
gathers cache pages into them, and :func:`hwplug.kernels.linear` converts
16-bit weight pieces into one.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence

import torch

__all__ = ["SCRATCH_BYTES", "Scratch", "scratch"]

SCRATCH_BYTES = 32 << 20
"""Largest buffer kept for reuse (per name, dtype, thread and device); a larger
request is allocated afresh."""


class Scratch(threading.local):
    """Named buffers, one set per thread: ``get(name, shape, dtype, device)`` gives a
    tensor of that shape whose contents are whatever the last user left."""

    def __init__(self) -> None:
        self.buffers: dict[tuple[str, torch.dtype, torch.device], torch.Tensor] = {}

    def get(
        self, name: str, shape: Sequence[int], dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        numel = math.prod(shape)
        if numel * dtype.itemsize > SCRATCH_BYTES:
            return torch.empty(tuple(shape), dtype=dtype, device=device)
        key = (name, dtype, device)
        buffer = self.buffers.get(key)
        if buffer is None or buffer.numel() < numel:
            # A normal tensor, even when made under inference_mode: an inference
            # tensor could not be written by a later call made outside it.
            with torch.inference_mode(False):
                buffer = self.buffers[key] = torch.empty(numel, dtype=dtype, device=device)
        return buffer[:numel].view(tuple(shape))


scratch = Scratch()
"""The process's scratch buffers (per thread)."""
