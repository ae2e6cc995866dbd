"""Paged decode attention on CPUs, reading the cache pages where they lie.

A decoding sequence has one query token; its attention reads every key and
value of its context once. Done with torch ops, the pages are first copied
into a dense tensor (a gather) and read again by SDPA: three passes over the
cache where one would do, and on a CPU that traffic is the cost. This module
runs a small C kernel (``csrc/paged_decode.c``) that follows the block table
and computes each sequence's attention with an online softmax, a page at a
time, for float32, bfloat16, float16 and fp8 caches (fp8 decoded through the
256 values of its codes), on torch's OpenMP threads.

The kernel is compiled on first use with the system's C compiler, with the
other native CPU kernels (:mod:`hwplug.kernels.native`: where and how they
are built and cached). Where it cannot be built (no compiler), or
``HWPLUG_NATIVE_KERNELS=0`` is set, :func:`native_decode_unavailable_reason`
says why and callers take their torch path (the torch attention backend
gathers, as before).
"""

from __future__ import annotations

import ctypes
import functools

import torch

from hwplug.kernels import native
from hwplug.kernels.formats import FP8_FORMATS

__all__ = [
    "NATIVE_MAX_BLOCK_SIZE",
    "NATIVE_CACHE_DTYPES",
    "NATIVE_QUERY_DTYPES",
    "native_decode_unavailable_reason",
    "paged_decode_attention",
]

NATIVE_MAX_BLOCK_SIZE = 256
"""The largest block size the kernel takes (its per-page score buffer)."""

_KINDS: dict[torch.dtype, int] = {
    torch.float32: 0,
    torch.bfloat16: 1,
    torch.float16: 2,
    **dict.fromkeys(FP8_FORMATS, 3),
}
NATIVE_CACHE_DTYPES = frozenset(_KINDS)
"""The cache dtypes the kernel reads."""
NATIVE_QUERY_DTYPES = frozenset({torch.float32, torch.bfloat16})
"""The query dtypes :func:`run` takes as they are (its result in the same dtype)."""


def native_decode_unavailable_reason(device: torch.device | str = "cpu") -> str | None:
    """Why the native decode kernel cannot run on ``device``'s tensors, or None when it can.

    It runs on CPU tensors when the kernel has been, or can be, built here and
    ``HWPLUG_NATIVE_KERNELS`` is not ``0`` (read at each call). The first call
    that can run builds the library (a few seconds, once per machine).
    """
    return native.unavailable_reason(device, "decode", loaded)


def paged_decode_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    scale: float,
    sliding_window: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of one query token per sequence over its paged keys and values.

    ``query`` is ``[n, num_heads, head_size]`` (any float dtype; computed in
    float32), the caches ``[num_blocks, block_size, num_kv_heads, head_size]``
    in a dtype of :data:`NATIVE_CACHE_DTYPES` (fp8 codes are decoded as
    they are, unscaled), ``block_table`` ``[n, >= blocks]`` block ids,
    ``seq_lens`` ``[n]`` lengths (the query is each sequence's last
    position). Query head ``h`` reads key/value head ``h // (num_heads //
    num_kv_heads)``. With ``sliding_window`` a sequence sees its last
    ``sliding_window`` positions. Returns float32 ``[n, num_heads,
    head_size]`` (into ``out`` when given).

    The values are checked (lengths in ``1..blocks * block_size``, block ids
    in range): a bad one is a ``ValueError``, never a read out of bounds.
    Raises ``RuntimeError`` with the reason when the kernel cannot run here.
    """
    reason = native_decode_unavailable_reason(query.device)
    if reason is not None:
        raise RuntimeError(f"the native paged decode kernel cannot run: {reason}")
    _check(query, key_cache, value_cache, block_table, seq_lens, sliding_window, out)
    n = query.shape[0]
    blocks, block_size = key_cache.shape[0], key_cache.shape[1]
    table = block_table.to(torch.int64)
    lens = seq_lens.to(torch.int64)
    if n:
        low, high = (int(x) for x in torch.aminmax(lens))
        if low < 1 or high > table.shape[1] * block_size:
            raise ValueError(
                f"seq_lens must lie in 1..{table.shape[1] * block_size} (the block table's "
                f"{table.shape[1]} blocks of {block_size}); got {low}..{high}"
            )
        # the columns each sequence reads: those its length covers
        columns = torch.arange(table.shape[1]).unsqueeze(0)
        ids = table[columns < (lens.unsqueeze(1) + block_size - 1) // block_size]
        if int(ids.min()) < 0 or int(ids.max()) >= blocks:
            raise ValueError(
                f"block_table holds block ids outside 0..{blocks - 1} within the sequences' "
                f"lengths: {int(ids.min())}..{int(ids.max())}"
            )
    return run(
        query.to(torch.float32),
        key_cache,
        value_cache,
        table,
        lens,
        scale=scale,
        sliding_window=sliding_window,
        out=out,
    )


def _check(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    sliding_window: int | None,
    out: torch.Tensor | None,
) -> None:
    if query.dim() != 3:
        raise ValueError(f"query must be [n, num_heads, head_size]; got {list(query.shape)}")
    if key_cache.dim() != 4 or key_cache.shape != value_cache.shape:
        raise ValueError(
            "key_cache and value_cache must both be [num_blocks, block_size, num_kv_heads, "
            f"head_size]; got {list(key_cache.shape)} and {list(value_cache.shape)}"
        )
    if key_cache.dtype != value_cache.dtype or key_cache.dtype not in _KINDS:
        allowed = ", ".join(sorted(str(d).removeprefix("torch.") for d in _KINDS))
        raise ValueError(
            f"the caches must share a dtype of {allowed}; got "
            f"{str(key_cache.dtype).removeprefix('torch.')} and "
            f"{str(value_cache.dtype).removeprefix('torch.')}"
        )
    n, heads, head_size = query.shape
    _, block_size, kv_heads, cache_head_size = key_cache.shape
    if cache_head_size != head_size or kv_heads == 0 or heads % kv_heads != 0:
        raise ValueError(
            f"query [n, {heads}, {head_size}] does not fit caches of {kv_heads} key/value heads "
            f"of size {cache_head_size}: the head sizes must match and the query heads be a "
            "multiple of the key/value heads"
        )
    if not 1 <= block_size <= NATIVE_MAX_BLOCK_SIZE:
        raise ValueError(f"block_size must lie in 1..{NATIVE_MAX_BLOCK_SIZE}; got {block_size}")
    if block_table.dim() != 2 or block_table.shape[0] != n or block_table.is_floating_point():
        raise ValueError(
            f"block_table must be an integer [n={n}, blocks] tensor; got "
            f"{list(block_table.shape)} of {block_table.dtype}"
        )
    if seq_lens.shape != (n,) or seq_lens.is_floating_point():
        raise ValueError(
            f"seq_lens must be an integer [n={n}] tensor; got {list(seq_lens.shape)} "
            f"of {seq_lens.dtype}"
        )
    if out is not None and (
        out.shape != query.shape or out.dtype != torch.float32 or not out.is_contiguous()
    ):
        raise ValueError(
            f"out must be a contiguous float32 tensor of the query's shape {list(query.shape)}; "
            f"got {list(out.shape)} of {out.dtype}"
            + ("" if out.is_contiguous() else ", not contiguous")
        )
    if sliding_window is not None and sliding_window < 1:
        raise ValueError(f"sliding_window must be >= 1 or None; got {sliding_window}")
    tensors = [query, key_cache, value_cache, block_table, seq_lens]
    devices = {t.device.type for t in tensors + ([] if out is None else [out])}
    if devices != {"cpu"}:
        raise ValueError(f"every tensor must be on the CPU; got {sorted(devices)}")


@functools.cache
def _code_values(dtype: torch.dtype) -> torch.Tensor:
    """The float32 value of each of the 256 codes of an fp8 dtype."""
    return torch.arange(256, dtype=torch.uint8).view(dtype).to(torch.float32)


def run(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    scale: float,
    sliding_window: int | None,
    out: torch.Tensor | None = None,
    write: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """The kernel on checked arguments (no value checks: the torch attention backend's
    ``prepare`` has made them): a float32 or bfloat16 ``query`` (see
    :data:`NATIVE_QUERY_DTYPES`), int64 ``block_table`` and ``seq_lens`` with every block
    id in range and every length covered by its row. The result is in the query's
    dtype (a bfloat16 query is widened in the kernel, its result rounded to nearest
    even there: what ``.to(torch.bfloat16)`` of the float32 result gives), into ``out``
    (contiguous, the query's shape and dtype) when given.

    ``write``: the step's new ``(keys, values, slots)``, stored in the caches by the
    same call before anything is read: keys and values contiguous ``[rows, kv_heads,
    head_size]`` in the cache's dtype (not fp8: its rows need scaling), int64
    ``slots`` ``[rows]`` each in range or negative (a padding row, not stored). Row
    ``i`` goes to slot ``slots[i]`` as :func:`hwplug.kernels.reference.write_slots`
    stores it, without its dispatch of two ``index_copy_`` calls."""
    library = loaded()
    if isinstance(library, str):
        raise RuntimeError(f"the native paged decode kernel cannot run: {library}")
    n, heads, head_size = query.shape
    _, block_size, kv_heads, _ = key_cache.shape
    query = query.contiguous()
    table = block_table if block_table.stride(-1) == 1 else block_table.contiguous()
    lens = seq_lens.contiguous()
    if out is None:
        out = torch.empty(query.shape, dtype=query.dtype)
    if n == 0 and write is None:
        return out
    kind = _KINDS[key_cache.dtype]
    codes = _code_values(key_cache.dtype) if kind == 3 else None
    if not in_place_layout(key_cache, value_cache):
        if write is not None:
            raise ValueError(
                "the native paged decode kernel stores rows only in caches of one layout "
                "whose last dimension is contiguous"
            )
        key_cache, value_cache = key_cache.contiguous(), value_cache.contiguous()
    strides = key_cache.stride()
    new_keys = new_values = slots = None
    rows = 0
    if write is not None:
        keys, values, slot_ids = write
        if kind == 3 or keys.dtype != key_cache.dtype or values.dtype != key_cache.dtype:
            raise ValueError(
                "the native paged decode kernel stores rows in the cache's own dtype "
                f"({key_cache.dtype}), not fp8; got {keys.dtype} and {values.dtype}"
            )
        if not (keys.is_contiguous() and values.is_contiguous() and slot_ids.is_contiguous()):
            raise ValueError("the native paged decode kernel stores contiguous rows and slots")
        if slot_ids.dtype != torch.int64 or keys.shape[0] != slot_ids.shape[0]:
            raise ValueError(
                "the native paged decode kernel stores one row per int64 slot; got "
                f"{keys.shape[0]} rows and {slot_ids.shape[0]} {slot_ids.dtype} slots"
            )
        new_keys, new_values, slots = keys.data_ptr(), values.data_ptr(), slot_ids.data_ptr()
        rows = slot_ids.shape[0]
    rc = library.hwplug_paged_decode(
        query.data_ptr(),
        _KINDS[query.dtype],
        key_cache.data_ptr(),
        value_cache.data_ptr(),
        kind,
        None if codes is None else codes.data_ptr(),
        strides[0],
        strides[1],
        strides[2],
        table.data_ptr(),
        table.stride(0),
        lens.data_ptr(),
        n,
        kv_heads,
        heads // kv_heads,
        head_size,
        block_size,
        0 if sliding_window is None else sliding_window,
        float(scale),
        out.data_ptr(),
        torch.get_num_threads(),
        new_keys,
        new_values,
        slots,
        rows,
    )
    if rc == 1:
        raise MemoryError("the native paged decode kernel could not allocate its work buffers")
    if rc != 0:
        raise RuntimeError(f"the native paged decode kernel failed (status {rc})")
    return out


def in_place_layout(key_cache: torch.Tensor, value_cache: torch.Tensor) -> bool:
    """Whether the kernel reads (and stores into) these caches where they lie: the same
    strides for both, the last dimension contiguous. Others are read from a contiguous
    copy."""
    return key_cache.stride() == value_cache.stride() and key_cache.stride(-1) == 1


# -- loading ----------------------------------------------------------------------------------


@functools.cache
def loaded() -> ctypes.CDLL | str:
    """The native library with the kernel's signature declared, or why there is none."""
    library = native.library()
    if not isinstance(library, str):
        _declare(library)
    return library


def _declare(library: ctypes.CDLL) -> None:
    i64, ptr, i32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
    function = library.hwplug_paged_decode
    function.restype = i32
    function.argtypes = [
        ptr, i32,  # query, its kind
        ptr, ptr, i32, ptr,  # key_cache, value_cache, kind, code values
        i64, i64, i64,  # cache strides: block, position, head
        ptr, i64, ptr,  # block table, its row stride, lengths
        i64, i32, i32, i32, i32,  # n, kv heads, group, head size, block size
        i64, ctypes.c_float, ptr, i32,  # window, scale, out, threads
        ptr, ptr, ptr, i64,  # new keys, new values, their slots, rows
    ]  # fmt: skip
