"""Pure-torch reference implementation of the paged KV-cache write and gather.

These functions define the semantics the Triton kernels must reproduce. They
take already validated arguments (see :mod:`hwplug.kernels.paged_kv`) and
scales as Python floats.
"""

from __future__ import annotations

import torch

from hwplug.kernels.formats import FP8_FORMATS

__all__ = ["dequantize", "gather_rows", "quantize", "write_rows"]


def quantize(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """Convert ``x`` to the cache ``dtype``.

    fp8: divide by ``scale`` in fp32, saturate to the finite range, round to
    nearest even (NaN stays NaN). Other dtypes: a plain cast; ``scale`` is
    ignored.
    """
    fmt = FP8_FORMATS.get(dtype)
    if fmt is None:
        return x.to(dtype)
    scaled = x.to(torch.float32) / torch.tensor(scale, dtype=torch.float32, device=x.device)
    limit = fmt.max_finite
    return scaled.clamp_(-limit, limit).to(dtype)


def dequantize(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """The inverse of :func:`quantize`: fp8 codes times ``scale``, cast to ``dtype``."""
    if x.dtype not in FP8_FORMATS:
        return x.to(dtype)
    wide = x.to(torch.float32) * torch.tensor(scale, dtype=torch.float32, device=x.device)
    return wide.to(dtype)


def write_rows(
    src: torch.Tensor, cache: torch.Tensor, slot_mapping: torch.Tensor, scale: float
) -> None:
    """Store ``src[i]`` into slot ``slot_mapping[i]`` of the paged ``cache``.

    Negative slots are padding and leave the cache untouched.
    """
    block_size = cache.shape[1]
    slots = slot_mapping.to(torch.int64)
    keep = slots >= 0
    slots = slots[keep]
    cache[slots // block_size, slots % block_size] = quantize(src[keep], scale, cache.dtype)


def gather_rows(
    cache: torch.Tensor, slot_mapping: torch.Tensor, scale: float, dtype: torch.dtype
) -> torch.Tensor:
    """Read slot ``slot_mapping[i]`` of ``cache`` into row ``i``; zero rows for padding."""
    block_size = cache.shape[1]
    slots = slot_mapping.to(torch.int64)
    keep = slots >= 0
    out = torch.zeros((slots.shape[0], *cache.shape[2:]), dtype=dtype, device=cache.device)
    slots = slots[keep]
    out[keep] = dequantize(cache[slots // block_size, slots % block_size], scale, dtype)
    return out
