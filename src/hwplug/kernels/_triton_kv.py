"""Triton implementation of the paged KV-cache write and gather.

Only imported when the Triton backend runs (it imports triton at the top).

One kernel serves both directions: it copies one row (``num_kv_heads x
head_size`` values) per program between a token-indexed tensor and a paged
cache, converting formats on the way. Every format conversion is done with
integer arithmetic on bit patterns instead of Triton's casts, because the
casts are not trustworthy: the interpreter's fp32 -> fp8 cast drops rounding
carries, rounds ties away from zero, truncates subnormals and mangles
out-of-range values and NaNs (triton#8322); its fp32 <-> bf16 conversions
truncate and mishandle subnormals; some GPUs round fp32 -> fp8 wrongly too
(triton#11753); and not every GPU has an fp8 conversion at all. Integer code
is exact everywhere, so the Triton path stores the same bytes as the torch
reference.

The kernel is a plain function: which form runs it (compiled ``JITFunction``
or ``InterpretedFunction``) is decided per call from ``TRITON_INTERPRET``, since
``triton.jit`` would only read that variable once, at import.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

from hwplug.kernels.formats import FP8_FORMATS

__all__ = ["gather_rows", "kernel_for", "write_rows"]

# Storage kinds of the tensors on either side of a copy (kernel constexprs).
_FP32, _FP16, _BF16, _FP8 = 0, 1, 2, 3
# fp8 flavours, see Fp8Format.flavor.
_FLAVORS = {"fn": 0, "ieee": 1, "fnuz": 2}
# Scale handling: none, divide (quantise on write), multiply (dequantise on gather).
_NO_SCALE, _DIVIDE, _MULTIPLY = 0, 1, 2

_MAX_BLOCK = 2048


def _copy_rows_kernel(
    src_ptr,
    dst_ptr,
    slot_ptr,
    scale,
    block_size,
    row_numel,
    src_s0,
    src_s1,
    src_s2,
    src_s3,
    dst_s0,
    dst_s1,
    dst_s2,
    dst_s3,
    SRC_PAGED: tl.constexpr,
    DST_PAGED: tl.constexpr,
    SRC_KIND: tl.constexpr,
    DST_KIND: tl.constexpr,
    SCALE_OP: tl.constexpr,
    MANT: tl.constexpr,
    BIAS: tl.constexpr,
    FLAVOR: tl.constexpr,
    MAX_VAL: tl.constexpr,
    SUB_STEP: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # HEAD_SIZE is a compile-time constant so that splitting offsets is cheap.
    # Row `row` of the token side is slot `slot_ptr[row]` of the paged side;
    # strides are in elements, 4 per side (the token side ignores its second).
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    slot = tl.load(slot_ptr + row).to(tl.int64)
    valid = slot >= 0
    safe_slot = tl.where(valid, slot, 0)
    head = offs // HEAD_SIZE
    dim = offs % HEAD_SIZE
    in_row = offs < row_numel
    # The interpreter rejects `block_mask & scalar`: fold the predicate into the bound.
    in_valid_row = offs < tl.where(valid, row_numel, 0)

    # padding rows are neither read (a gather yields zeros) nor written
    if SRC_PAGED:
        src_base = (safe_slot // block_size) * src_s0 + (safe_slot % block_size) * src_s1
    else:
        src_base = row * src_s0
    raw = tl.load(src_ptr + src_base + head * src_s2 + dim * src_s3, mask=in_valid_row, other=0)

    # ---- decode to fp32 --------------------------------------------------
    if SRC_KIND == 3:
        code = raw.to(tl.int32)
        neg = code >= 128
        a = code & 0x7F
        # normal: rebias the exponent and widen the mantissa; subnormal: a * step
        normal_bits = (a + ((127 - BIAS) << MANT)) << (23 - MANT)
        sub_bits = (a.to(tl.float32) * SUB_STEP).to(tl.int32, bitcast=True)
        mag_bits = tl.where(a >= (1 << MANT), normal_bits, sub_bits)
        if FLAVOR == 0:
            mag_bits = tl.where(a == 0x7F, 0x7FC00000, mag_bits)
        if FLAVOR == 1:
            top = ((1 << (7 - MANT)) - 1) << MANT
            special = tl.where(a == top, 0x7F800000, 0x7FC00000)
            mag_bits = tl.where(a >= top, special, mag_bits)
        if FLAVOR == 2:
            mag_bits = tl.where(code == 0x80, 0x7FC00000, mag_bits)
            neg = neg & (code != 0x80)
        bits = mag_bits | (neg.to(tl.int32) << 31)
        x = bits.to(tl.float32, bitcast=True)
    elif SRC_KIND == 2:
        x = (raw.to(tl.int32) << 16).to(tl.float32, bitcast=True)
    else:
        x = raw.to(tl.float32)

    # ---- scale -----------------------------------------------------------
    if SCALE_OP == 1:
        x = tl.div_rn(x, tl.full(x.shape, scale, tl.float32))
        # comparisons are false for NaN, so NaN survives saturation
        x = tl.where(x > MAX_VAL, MAX_VAL, x)
        x = tl.where(x < -MAX_VAL, -MAX_VAL, x)
    if SCALE_OP == 2:
        x = x * scale

    # ---- encode ----------------------------------------------------------
    if DST_KIND == 3:
        xbits = x.to(tl.int32, bitcast=True)
        neg_out = xbits < 0
        mag = xbits & 0x7FFFFFFF
        is_nan = mag > 0x7F800000
        # normal: round to nearest even on the bit pattern, then rebias; a
        # carry out of the mantissa correctly bumps the exponent
        SHIFT: tl.constexpr = 23 - MANT
        lsb = (mag >> SHIFT) & 1
        rounded = (mag + ((1 << (SHIFT - 1)) - 1) + lsb) >> SHIFT
        code_normal = rounded - ((127 - BIAS) << MANT)
        # subnormal: count steps, rounding to nearest even through 2**23
        steps = mag.to(tl.float32, bitcast=True) * (1.0 / SUB_STEP)
        code_sub = ((steps + 8388608.0) - 8388608.0).to(tl.int32)
        min_normal_bits = (128 - BIAS) << 23
        code = tl.where(mag < min_normal_bits, code_sub, code_normal)
        if FLAVOR == 2:
            # no negative zero in fnuz formats: 0x80 is their NaN
            neg_out = neg_out & (code != 0)
            out = tl.where(neg_out, code | 0x80, code)
            out = tl.where(is_nan, 0x80, out)
        else:
            out = tl.where(neg_out, code | 0x80, code)
            out = tl.where(is_nan, tl.where(neg_out, 0xFF, 0x7F), out)
        y = out.to(tl.uint8)
    elif DST_KIND == 2:
        xbits = x.to(tl.int32, bitcast=True)
        mag = xbits & 0x7FFFFFFF
        lsb = (mag >> 16) & 1
        # overflow carries into an all-ones exponent: infinity, as torch rounds
        half = (mag + 0x7FFF + lsb) >> 16
        half = tl.where(mag > 0x7F800000, 0x7FC0, half)
        half = tl.where(xbits < 0, half | 0x8000, half)
        y = half.to(tl.int16)
    elif DST_KIND == 1:
        y = x.to(tl.float16)
    else:
        y = x

    if DST_PAGED:
        dst_base = (safe_slot // block_size) * dst_s0 + (safe_slot % block_size) * dst_s1
        store_mask = in_valid_row
    else:
        dst_base = row * dst_s0
        store_mask = in_row
    tl.store(dst_ptr + dst_base + head * dst_s2 + dim * dst_s3, y, mask=store_mask)


_KERNELS: dict[tuple[str, bool], Any] = {}


def kernel_for(interpret: bool) -> Any:
    """The copy kernel in its interpreted or compiled form (built once per form)."""
    key = (_copy_rows_kernel.__name__, interpret)
    kernel = _KERNELS.get(key)
    if kernel is None:
        # the interpreter needs numpy; the compiled path must not
        from triton.runtime.interpreter import InterpretedFunction

        kernel = (
            InterpretedFunction(_copy_rows_kernel) if interpret else JITFunction(_copy_rows_kernel)
        )
        _KERNELS[key] = kernel
    return kernel


def _storage(t: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The tensor the kernel reads or writes (bit views for bf16 and fp8) and its kind."""
    if t.dtype in FP8_FORMATS:
        return t.view(torch.uint8), _FP8
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16), _BF16
    if t.dtype == torch.float16:
        return t, _FP16
    return t, _FP32


def _launch(
    src: torch.Tensor,
    dst: torch.Tensor,
    slot_mapping: torch.Tensor,
    scale: float,
    *,
    write: bool,
    interpret: bool,
) -> None:
    paged, flat = (dst, src) if write else (src, dst)
    num_rows = flat.shape[0]
    num_heads, head_size = flat.shape[1], flat.shape[2]
    row_numel = num_heads * head_size
    if num_rows == 0 or row_numel == 0:
        return
    fp8 = FP8_FORMATS.get(paged.dtype)
    if fp8 is None:
        scale_op = _NO_SCALE
        mant, bias, flavor, max_val, sub_step = 3, 7, 0, 448.0, 2.0**-9
    else:
        scale_op = _DIVIDE if write else _MULTIPLY
        mant, bias = fp8.mantissa_bits, fp8.exponent_bias
        flavor, max_val, sub_step = _FLAVORS[fp8.flavor], fp8.max_finite, fp8.subnormal_step
    src_store, src_kind = _storage(src)
    dst_store, dst_kind = _storage(dst)

    def strides(t: torch.Tensor, is_paged: bool) -> tuple[int, ...]:
        if is_paged:
            return tuple(t.stride())
        s = t.stride()
        return (s[0], 0, s[1], s[2])

    block = min(triton.next_power_of_2(row_numel), _MAX_BLOCK)
    grid = (num_rows, triton.cdiv(row_numel, block))
    kernel = kernel_for(interpret)
    args = (
        src_store,
        dst_store,
        slot_mapping,
        float(scale),
        paged.shape[1],
        row_numel,
        *strides(src, not write),
        *strides(dst, write),
    )
    consts: dict[str, Any] = {
        "SRC_PAGED": not write,
        "DST_PAGED": write,
        "SRC_KIND": src_kind,
        "DST_KIND": dst_kind,
        "SCALE_OP": scale_op,
        "MANT": mant,
        "BIAS": bias,
        "FLAVOR": flavor,
        "MAX_VAL": max_val,
        "SUB_STEP": sub_step,
        "HEAD_SIZE": head_size,
        "BLOCK": block,
    }
    if interpret:
        # numpy warns about the (masked, discarded) lanes it computes on
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            kernel[grid](*args, **consts)
    else:
        # no fused multiply-adds: every rounding step above is meant to happen
        kernel[grid](*args, **consts, enable_fp_fusion=False)


def write_rows(
    src: torch.Tensor,
    cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    scale: float,
    *,
    interpret: bool,
) -> None:
    """Triton counterpart of :func:`hwplug.kernels.reference.write_rows`."""
    _launch(src, cache, slot_mapping, scale, write=True, interpret=interpret)


def gather_rows(
    cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    scale: float,
    dtype: torch.dtype,
    *,
    interpret: bool,
) -> torch.Tensor:
    """Triton counterpart of :func:`hwplug.kernels.reference.gather_rows`."""
    out = torch.empty((slot_mapping.shape[0], *cache.shape[2:]), dtype=dtype, device=cache.device)
    _launch(cache, out, slot_mapping, scale, write=False, interpret=interpret)
    return out
