"""Pure-torch reference implementation of the paged KV-cache write and gather.

These functions define the semantics the Triton kernels must reproduce. They
take already validated arguments (see :mod:`hwplug.kernels.paged_kv`); a
scale is a Python float or a one-element float32 tensor (used on the device,
never read back).
"""

from __future__ import annotations

import torch

from hwplug.kernels.formats import FP8_FORMATS

__all__ = ["dequantize", "gather_rows", "quantize", "write_rows", "write_slots"]

# Widest first: copying rows as 8-byte words moves the same bytes with 8x fewer elements.
_WORD_DTYPES = (torch.int64, torch.int32, torch.int16, torch.uint8)
# Elements quantised per piece: a 1 MiB fp32 intermediate.
_QUANTIZE_CHUNK = 1 << 18


def _scale_1d(scale: float | torch.Tensor, device: torch.device) -> torch.Tensor:
    """``scale`` as a one-element float32 tensor on ``device``.

    One-element rather than 0-d on purpose: a 0-d tensor does not take part in
    type promotion, so ``bfloat16 / scale`` would divide in bfloat16.
    """
    if isinstance(scale, torch.Tensor):
        return scale.reshape(1).to(device=device, dtype=torch.float32)
    return torch.tensor([scale], dtype=torch.float32, device=device)


def quantize(x: torch.Tensor, scale: float | torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Convert ``x`` to the cache ``dtype``.

    fp8: divide by ``scale`` in fp32, saturate to the finite range, round to
    nearest even (NaN stays NaN). Other dtypes: a plain cast; ``scale`` is
    ignored.
    """
    fmt = FP8_FORMATS.get(dtype)
    if fmt is None:
        return x.to(dtype)
    scale_1d = _scale_1d(scale, x.device)
    limit = fmt.max_finite
    out = torch.empty(x.shape, dtype=dtype, device=x.device)
    flat_in, flat_out = x.reshape(-1), out.view(-1)
    # In pieces, through one reused fp32 buffer that stays in cache, rather than whole-tensor
    # passes over a fresh fp32 intermediate four times the size of the result.
    scratch = torch.empty(min(flat_in.numel(), _QUANTIZE_CHUNK), device=x.device)
    for start in range(0, flat_in.numel(), _QUANTIZE_CHUNK):
        piece = flat_in[start : start + _QUANTIZE_CHUNK]
        wide = scratch[: piece.numel()]
        torch.div(piece, scale_1d, out=wide)  # in fp32 (see _scale_1d)
        flat_out[start : start + piece.numel()].copy_(wide.clamp_(-limit, limit))
    return out


def dequantize(x: torch.Tensor, scale: float | torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The inverse of :func:`quantize`: fp8 codes times ``scale``, cast to ``dtype``."""
    if x.dtype not in FP8_FORMATS:
        return x.to(dtype)
    wide = x.to(torch.float32) * _scale_1d(scale, x.device)
    return wide.to(dtype)


def _slot_rows(cache: torch.Tensor) -> torch.Tensor | None:
    """``cache`` as a ``[num_slots, row_bytes]`` byte view, or None when slots are not evenly
    spaced rows (then the caller indexes block and offset separately)."""
    num_blocks, block_size, heads, head_size = cache.shape
    s0, s1, s2, s3 = cache.stride()
    if s3 != 1 or s2 != head_size or (num_blocks > 1 and s0 != block_size * s1):
        return None
    rows = cache.as_strided((num_blocks * block_size, heads * head_size), (s1, 1))
    return rows.view(torch.uint8)


def _as_words(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two byte tensors with rows of equal length, viewed as the widest words both allow."""
    for word in _WORD_DTYPES:
        try:
            return a.view(word), b.view(word)
        except RuntimeError:  # row length, offset or strides not a multiple of the word
            continue
    return a, b


def write_rows(
    src: torch.Tensor,
    cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    scale: float | torch.Tensor,
) -> None:
    """Store ``src[i]`` into slot ``slot_mapping[i]`` of the paged ``cache``.

    Negative slots are padding and leave the cache untouched (finding out
    whether there are any reads one value back from the device; a caller that
    knows which rows are real uses :func:`write_slots`, which reads nothing).
    """
    slots = slot_mapping.to(torch.int64)
    if bool((slots < 0).any()):
        keep = slots >= 0
        slots, src = slots[keep], src[keep]
    write_slots(src, cache, slots, scale)


def write_slots(
    src: torch.Tensor,
    cache: torch.Tensor,
    slots: torch.Tensor,
    scale: float | torch.Tensor,
) -> None:
    """Store ``src[i]`` into slot ``slots[i]`` of ``cache``; every slot is a real one
    (in range, not negative: the caller checked). Reads nothing back from the device."""
    if slots.shape[0] == 0:
        return
    rows = quantize(src, scale, cache.dtype)
    slots = slots.to(torch.int64)
    flat = _slot_rows(cache)
    if flat is None:
        block_size = cache.shape[1]
        cache[slots // block_size, slots % block_size] = rows
        return
    source = rows.reshape(rows.shape[0], cache.shape[2] * cache.shape[3]).view(torch.uint8)
    target, source = _as_words(flat, source)
    target.index_copy_(0, slots, source)


def gather_rows(
    cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    scale: float | torch.Tensor,
    dtype: torch.dtype,
) -> torch.Tensor:
    """Read slot ``slot_mapping[i]`` of ``cache`` into row ``i``; zero rows for padding."""
    block_size = cache.shape[1]
    slots = slot_mapping.to(torch.int64)
    keep = slots >= 0
    out = torch.zeros((slots.shape[0], *cache.shape[2:]), dtype=dtype, device=cache.device)
    slots = slots[keep]
    out[keep] = dequantize(cache[slots // block_size, slots % block_size], scale, dtype)
    return out
