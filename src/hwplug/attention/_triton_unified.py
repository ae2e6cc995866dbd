"""The Triton kernel behind the ``triton`` attention backend.

Only imported when that backend runs (it imports triton at the top).

One kernel serves prefill, chunked prefill, decode and mixed batches
straight from the paged cache. A program handles ``BLOCK_Q`` consecutive
query tokens of one sequence for every query head that shares one key/value
head (``BLOCK_M = BLOCK_Q x padded group`` rows), walks the key positions the
tile may see in tiles of ``TILE_N``, looks each position's slot up in the
block table (so the cache block size is independent of the tile), and keeps
an online softmax in fp32.

Nothing in the launch reads a tensor value on the host: the grid is sized
from shapes (``num_tokens // BLOCK_Q + num_seqs`` query tiles, an upper bound
on what the batch can need), each program finds its sequence by a binary
search over ``query_start_loc`` on the device, and tensor scales are loaded
by the kernel. The whole forward can therefore be captured in a CUDA graph.

Format conversions mirror :mod:`hwplug.kernels._triton_kv`: fp8 and bf16 are
decoded from their bit patterns with integer arithmetic (exact on every GPU
and in the interpreter, and independent of which fp8 types a GPU converts),
and a bf16 output is rounded to nearest even by hand (the interpreter's cast
truncates).
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

from hwplug.kernels import _triton_kv
from hwplug.kernels.formats import FP8_FORMATS

if TYPE_CHECKING:
    from hwplug.attention.call import AttentionCall

__all__ = ["Launch", "kernel_for", "plan_launch", "unified_attention", "write_new_tokens"]

# Storage kinds (kernel constexprs), as in hwplug.kernels._triton_kv.
_FP32, _FP16, _BF16, _FP8 = 0, 1, 2, 3
_FLAVORS = {"fn": 0, "ieee": 1, "fnuz": 2}
_LOG2E = 1.4426950408889634

# tl.max, tl.sum and tl.zeros are themselves @triton.jit functions, frozen in the form
# TRITON_INTERPRET chose when triton was first imported: imported without it, the
# interpreter cannot call them. The kernel therefore reduces with the builtin tl.reduce
# and triton's own combine functions, which the compiler compiles and the interpreter
# recognises (and runs as one numpy call) whatever the import order.
_MAX = tl.standard._elementwise_max
_SUM = tl.standard._sum_combine


def _unified_attention_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    out_ptr,
    block_table_ptr,
    seq_lens_ptr,
    query_start_loc_ptr,
    k_scale,
    v_scale,
    qk_scale,
    num_seqs,
    block_size,
    window,
    q_s0,
    q_s1,
    q_s2,
    k_s0,
    k_s1,
    k_s2,
    k_s3,
    v_s0,
    v_s1,
    v_s2,
    v_s3,
    o_s0,
    o_s1,
    o_s2,
    bt_s0,
    bt_s1,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_M: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    TILE_N: tl.constexpr,
    Q_KIND: tl.constexpr,
    CACHE_KIND: tl.constexpr,
    DOT_KIND: tl.constexpr,
    MANT: tl.constexpr,
    BIAS: tl.constexpr,
    FLAVOR: tl.constexpr,
    SUB_STEP: tl.constexpr,
    SCALES_IN_MEMORY: tl.constexpr,
    USE_WINDOW: tl.constexpr,
):
    q_tile = tl.program_id(0)
    kv_head = tl.program_id(1)

    # ---- which sequence: the last b with query_start_loc[b] // BLOCK_Q + b <= q_tile.
    # Sequence b owns tiles [qsl[b] // BLOCK_Q + b, ... + cdiv(q_len_b, BLOCK_Q)), and
    # these ranges never overlap, so a tile belongs to at most one sequence.
    # typed: an int argument equal to 1 arrives as a constexpr, and the loop
    # should carry int32 tensors whatever the launch specialised
    lo: tl.int32 = 0
    hi: tl.int32 = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        first_tile = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        if first_tile <= q_tile:
            lo = mid + 1
        else:
            hi = mid
    seq = lo - 1

    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + seq)
    context = seq_len - q_len  # positions cached before this step's tokens
    first_q = (q_tile - (q_start // BLOCK_Q + seq)) * BLOCK_Q  # first query row in the sequence

    # ---- the tile's rows: BLOCK_Q query tokens x GROUP_PAD heads of the group
    offs_m = tl.arange(0, BLOCK_M)
    q_row = first_q + offs_m // GROUP_PAD
    head = kv_head * GROUP + offs_m % GROUP_PAD
    row_ok = (q_row < q_len) & (offs_m % GROUP_PAD < GROUP)
    q_pos = context + q_row
    offs_d = tl.arange(0, HEAD_PAD)
    d_ok = offs_d < HEAD_SIZE

    token = (q_start + q_row).to(tl.int64)
    q_offs = token[:, None] * q_s0 + head[:, None].to(tl.int64) * q_s1 + offs_d[None, :] * q_s2
    io_mask = row_ok[:, None] & d_ok[None, :]
    q_raw = tl.load(q_ptr + q_offs, mask=io_mask, other=0)
    if Q_KIND == 2:
        q = (q_raw.to(tl.int32) << 16).to(tl.float32, bitcast=True)
    else:
        q = q_raw.to(tl.float32)
    if DOT_KIND == 1:
        q = q.to(tl.float16)
    if DOT_KIND == 2:
        q = q.to(tl.bfloat16)

    # ---- the key positions this tile can see (none when the tile has no rows)
    rows_here = tl.minimum(q_len - first_q, BLOCK_Q)
    kv_end = tl.where(rows_here > 0, context + first_q + rows_here, 0)
    kv_begin = 0
    if USE_WINDOW:
        kv_begin = tl.maximum(context + first_q - window + 1, 0)

    sm_scale = qk_scale
    if CACHE_KIND == 3:
        if SCALES_IN_MEMORY:
            sm_scale = qk_scale * tl.load(k_scale).to(tl.float32)
        else:
            sm_scale = qk_scale * k_scale

    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.full([BLOCK_M], 0.0, tl.float32)
    acc = tl.full([BLOCK_M, HEAD_PAD], 0.0, tl.float32)
    table_row = block_table_ptr + seq.to(tl.int64) * bt_s0

    for start in range(kv_begin, kv_end, TILE_N):
        pos = start + tl.arange(0, TILE_N)
        pos_ok = pos < kv_end
        block = tl.load(table_row + (pos // block_size) * bt_s1, mask=pos_ok, other=0)
        block = block.to(tl.int64)
        offset = (pos % block_size).to(tl.int64)
        kv_mask = pos_ok[:, None] & d_ok[None, :]

        k_offs = block * k_s0 + offset * k_s1 + kv_head * k_s2
        k_raw = tl.load(
            k_cache_ptr + k_offs[:, None] + offs_d[None, :] * k_s3, mask=kv_mask, other=0
        )
        v_offs = block * v_s0 + offset * v_s1 + kv_head * v_s2
        v_raw = tl.load(
            v_cache_ptr + v_offs[:, None] + offs_d[None, :] * v_s3, mask=kv_mask, other=0
        )

        # ---- decode the cache to fp32 (exactly), then to the dot's input type
        if CACHE_KIND == 3:
            kc = k_raw.to(tl.int32)
            vc = v_raw.to(tl.int32)
            k_mag = kc & 0x7F
            v_mag = vc & 0x7F
            # normal codes: rebias the exponent, widen the mantissa; subnormal: code * step
            k_bits = (k_mag + ((127 - BIAS) << MANT)) << (23 - MANT)
            v_bits = (v_mag + ((127 - BIAS) << MANT)) << (23 - MANT)
            k_bits = tl.where(
                k_mag >= (1 << MANT),
                k_bits,
                (k_mag.to(tl.float32) * SUB_STEP).to(tl.int32, bitcast=True),
            )
            v_bits = tl.where(
                v_mag >= (1 << MANT),
                v_bits,
                (v_mag.to(tl.float32) * SUB_STEP).to(tl.int32, bitcast=True),
            )
            k_neg = kc >= 128
            v_neg = vc >= 128
            if FLAVOR == 0:
                k_bits = tl.where(k_mag == 0x7F, 0x7FC00000, k_bits)
                v_bits = tl.where(v_mag == 0x7F, 0x7FC00000, v_bits)
            if FLAVOR == 1:
                top = ((1 << (7 - MANT)) - 1) << MANT
                k_bits = tl.where(
                    k_mag >= top, tl.where(k_mag == top, 0x7F800000, 0x7FC00000), k_bits
                )
                v_bits = tl.where(
                    v_mag >= top, tl.where(v_mag == top, 0x7F800000, 0x7FC00000), v_bits
                )
            if FLAVOR == 2:
                k_bits = tl.where(kc == 0x80, 0x7FC00000, k_bits)
                v_bits = tl.where(vc == 0x80, 0x7FC00000, v_bits)
                k_neg = k_neg & (kc != 0x80)
                v_neg = v_neg & (vc != 0x80)
            k = (k_bits | (k_neg.to(tl.int32) << 31)).to(tl.float32, bitcast=True)
            v = (v_bits | (v_neg.to(tl.int32) << 31)).to(tl.float32, bitcast=True)
        elif CACHE_KIND == 2:
            k = (k_raw.to(tl.int32) << 16).to(tl.float32, bitcast=True)
            v = (v_raw.to(tl.int32) << 16).to(tl.float32, bitcast=True)
        else:
            k = k_raw.to(tl.float32)
            v = v_raw.to(tl.float32)

        # ---- scores, masks, online softmax (in base 2: the scale carries log2(e))
        if DOT_KIND == 0:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        elif DOT_KIND == 1:
            s = tl.dot(q, tl.trans(k.to(tl.float16)))
        else:
            s = tl.dot(q, tl.trans(k.to(tl.bfloat16)))
        s = s * sm_scale
        visible = (pos[None, :] <= q_pos[:, None]) & pos_ok[None, :]
        if USE_WINDOW:
            visible = visible & (pos[None, :] > q_pos[:, None] - window)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.reduce(s, 1, _MAX))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.reduce(p, 1, _SUM)
        if DOT_KIND == 0:
            pv = tl.dot(p, v, input_precision="ieee")
        elif DOT_KIND == 1:
            pv = tl.dot(p.to(tl.float16), v.to(tl.float16))
        else:
            pv = tl.dot(p.to(tl.bfloat16), v.to(tl.bfloat16))
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    # rows that saw no key (padding lanes) have l == 0: write zeros, not 0/0
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    if CACHE_KIND == 3:
        if SCALES_IN_MEMORY:
            out = out * tl.load(v_scale).to(tl.float32)
        else:
            out = out * v_scale

    o_offs = token[:, None] * o_s0 + head[:, None].to(tl.int64) * o_s1 + offs_d[None, :] * o_s2
    if Q_KIND == 2:
        # round to nearest even on the bit pattern; NaN stays NaN
        bits = out.to(tl.int32, bitcast=True)
        mag = bits & 0x7FFFFFFF
        half = (mag + 0x7FFF + ((mag >> 16) & 1)) >> 16
        half = tl.where(mag > 0x7F800000, 0x7FC0, half)
        half = tl.where(bits < 0, half | 0x8000, half)
        tl.store(out_ptr + o_offs, half.to(tl.int16), mask=io_mask)
    elif Q_KIND == 1:
        tl.store(out_ptr + o_offs, out.to(tl.float16), mask=io_mask)
    else:
        tl.store(out_ptr + o_offs, out, mask=io_mask)


_KERNELS: dict[bool, Any] = {}


def kernel_for(interpret: bool) -> Any:
    """The attention kernel in its interpreted or compiled form (built once per form)."""
    kernel = _KERNELS.get(interpret)
    if kernel is None:
        from triton.runtime.interpreter import InterpretedFunction

        kernel = (
            InterpretedFunction(_unified_attention_kernel)
            if interpret
            else JITFunction(_unified_attention_kernel)
        )
        _KERNELS[interpret] = kernel
    return kernel


def _kind(dtype: torch.dtype) -> int:
    if dtype in FP8_FORMATS:
        return _FP8
    return {torch.bfloat16: _BF16, torch.float16: _FP16}.get(dtype, _FP32)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor the kernel reads or writes: bit views for fp8 and bf16."""
    if t.dtype in FP8_FORMATS:
        return t.view(torch.uint8)
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16)
    return t


def _dot_kind(query: torch.dtype, cache: torch.dtype, interpret: bool) -> int:
    """fp32 dots for fp32 queries; 16-bit dots when the cache converts to them exactly.

    The interpreter multiplies bfloat16 tiles as their integer bit patterns,
    so bfloat16 dots run in fp32 there.
    """
    exact = cache in FP8_FORMATS or cache == query
    if query == torch.float16 and exact:
        return _FP16
    if query == torch.bfloat16 and exact and not interpret:
        return _BF16
    return _FP32


def _scale_arg(
    scale: float | torch.Tensor, device: torch.device
) -> tuple[float | torch.Tensor, bool]:
    """A scale as the kernel takes it: a float, or a tensor it loads (no host read)."""
    if isinstance(scale, torch.Tensor):
        if scale.device == device:
            return scale.reshape(()), True
        return float(scale), False  # a CPU tensor next to device tensors: a host read only
    return float(scale), False


def _in_memory(scale: float | torch.Tensor, device: torch.device) -> torch.Tensor:
    if isinstance(scale, torch.Tensor):
        return scale
    return torch.full((), scale, dtype=torch.float32, device=device)


def write_new_tokens(call: AttentionCall, *, interpret: bool) -> None:
    """Write the call's keys and values: ``write_kv_cache`` semantics without its host
    reads (slot range, tensor scales).

    A tensor scale of an fp8 cache is applied on the device (an fp32 division,
    as the write does) and the kernel then divides by 1.0, which is exact: the
    stored bytes are those of ``write_kv_cache``.
    """
    slots = call.metadata.slot_mapping.contiguous()
    for src, cache, scale in (
        (call.key, call.key_cache, call.k_scale),
        (call.value, call.value_cache, call.v_scale),
    ):
        arg, in_memory = _scale_arg(scale, src.device)
        if cache.dtype not in FP8_FORMATS:
            _triton_kv.write_rows(src, cache, slots, 1.0, interpret=interpret)
        elif isinstance(arg, torch.Tensor) and in_memory:
            divided = src.to(torch.float32) / arg.reshape(1)
            _triton_kv.write_rows(divided, cache, slots, 1.0, interpret=interpret)
        else:
            _triton_kv.write_rows(src, cache, slots, float(arg), interpret=interpret)


class Launch(NamedTuple):
    """One launch of the attention kernel: grid, positional arguments, constexprs."""

    grid: tuple[int, int]
    args: tuple[Any, ...]
    constexprs: dict[str, Any]


def plan_launch(
    call: AttentionCall,
    out: torch.Tensor,
    *,
    scale: float,
    sliding_window: int | None,
    interpret: bool,
) -> Launch:
    """How the kernel is launched for a call writing into ``out``; everything from
    shapes and dtypes."""
    query, key_cache, value_cache = call.query, call.key_cache, call.value_cache
    metadata, k_scale, v_scale = call.metadata, call.k_scale, call.v_scale
    num_tokens, num_heads, head_size = query.shape
    num_kv_heads = key_cache.shape[2]
    num_seqs = metadata.seq_lens.shape[0]
    group = num_heads // num_kv_heads
    group_pad = triton.next_power_of_2(group)
    head_pad = max(triton.next_power_of_2(head_size), 16)
    dot_kind = _dot_kind(query.dtype, key_cache.dtype, interpret)
    # at least 16 rows for tl.dot; prefill-heavy batches get taller tiles where
    # registers allow (16-bit dots, heads up to 128)
    tall = num_tokens >= 4 * num_seqs and dot_kind != _FP32 and head_pad <= 128
    block_m = max(64 if tall else 16, group_pad)
    block_q = block_m // group_pad
    tile_n = 32 if head_pad <= 128 else 16

    fmt = FP8_FORMATS.get(key_cache.dtype)
    if fmt is None:
        mant, bias, flavor, sub_step = 3, 7, 0, 2.0**-9
    else:
        mant, bias = fmt.mantissa_bits, fmt.exponent_bias
        flavor, sub_step = _FLAVORS[fmt.flavor], fmt.subnormal_step
    ks, ks_in_memory = _scale_arg(k_scale, query.device)
    vs, vs_in_memory = _scale_arg(v_scale, query.device)
    if ks_in_memory != vs_in_memory:  # one constexpr covers both: move both to memory
        ks, vs = (_in_memory(s, query.device) for s in (ks, vs))
        ks_in_memory = True

    args = (
        _bits(query),
        _bits(key_cache),
        _bits(value_cache),
        _bits(out),
        metadata.block_table,
        metadata.seq_lens,
        metadata.query_start_loc,
        ks,
        vs,
        scale * _LOG2E,
        num_seqs,
        key_cache.shape[1],
        sliding_window or 0,
        *query.stride(),
        *key_cache.stride(),
        *value_cache.stride(),
        *out.stride(),
        *metadata.block_table.stride(),
    )
    constexprs: dict[str, Any] = {
        "GROUP": group,
        "GROUP_PAD": group_pad,
        "BLOCK_Q": block_q,
        "BLOCK_M": block_m,
        "HEAD_SIZE": head_size,
        "HEAD_PAD": head_pad,
        "TILE_N": tile_n,
        "Q_KIND": _kind(query.dtype),
        "CACHE_KIND": _kind(key_cache.dtype),
        "DOT_KIND": dot_kind,
        "MANT": mant,
        "BIAS": bias,
        "FLAVOR": flavor,
        "SUB_STEP": sub_step,
        "SCALES_IN_MEMORY": ks_in_memory,
        "USE_WINDOW": sliding_window is not None,
    }
    return Launch((num_tokens // block_q + num_seqs, num_kv_heads), args, constexprs)


def unified_attention(
    call: AttentionCall,
    *,
    scale: float,
    sliding_window: int | None,
    interpret: bool,
) -> torch.Tensor:
    """Write this step's keys and values, then attend over the paged cache.

    Arguments are checked by the caller. Reads no tensor value on the host.
    """
    write_new_tokens(call, interpret=interpret)
    out = torch.empty_like(call.query)
    if call.query.shape[0] == 0 or call.metadata.seq_lens.shape[0] == 0:
        return out
    launch = plan_launch(call, out, scale=scale, sliding_window=sliding_window, interpret=interpret)
    kernel = kernel_for(interpret)
    if interpret:
        # numpy warns about masked lanes it computes on (exp2(-inf), 0 * inf)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            kernel[launch.grid](*launch.args, **launch.constexprs)
    else:
        # fusing multiply-adds only helps here (nothing relies on separate roundings)
        kernel[launch.grid](*launch.args, **launch.constexprs, enable_fp_fusion=True)
    return out
