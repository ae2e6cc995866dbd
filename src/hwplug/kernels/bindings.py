"""The ctypes marshalling of the native kernels: C signatures, layouts and statuses.

This is the only module that hands pointers to the C kernels of ``csrc/``
(built and loaded by :mod:`hwplug.kernels.native`). Its functions take
tensors that have passed their entry's rules (:mod:`hwplug.kernels.checks`)
and:

- declare every C function's argument types once per loaded library;
- lay each tensor out as the C side reads it: strides are passed where C
  takes them (rows), and anything else is copied to the layout it needs (an
  output the kernel cannot write where it lies is computed into a buffer of
  its own and copied in);
- turn a C status into a Python error: bad sizes and indices (which C checks
  against the buffers they address) are a
  :class:`~hwplug.kernels.checks.KernelArgumentError` naming the value and
  what is allowed, a failed allocation a ``MemoryError``.

:func:`library` reads ``HWPLUG_NATIVE_KERNELS`` at each call, before anything
is built: with ``0`` it is the reason and nothing is compiled.
"""

from __future__ import annotations

import ctypes
import functools
import os
from dataclasses import dataclass
from typing import Any

import torch

from hwplug.kernels import native
from hwplug.kernels.checks import KernelArgumentError
from hwplug.kernels.formats import FP8_FORMATS

__all__ = [
    "CACHE_KINDS",
    "LINEAR_KINDS",
    "QUERY_KINDS",
    "Capabilities",
    "capabilities",
    "library",
    "linear",
    "paged_decode",
]

LINEAR_KINDS = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
"""The weight dtypes ``hwplug_linear`` reads, and its code for each."""
CACHE_KINDS: dict[torch.dtype, int] = {
    torch.float32: 0,
    torch.bfloat16: 1,
    torch.float16: 2,
    **dict.fromkeys(FP8_FORMATS, 3),
}
"""The cache dtypes ``hwplug_paged_decode`` reads (fp8: codes decoded through a table)."""
QUERY_KINDS = {torch.float32: 0, torch.bfloat16: 1}
"""The query dtypes ``hwplug_paged_decode`` reads as they are."""
MAX_BLOCK_SIZE = 256
"""The largest block size ``hwplug_paged_decode`` takes (its per-page score buffer)."""


def library() -> ctypes.CDLL | str:
    """The native library with every signature declared, or why it cannot run now
    (``HWPLUG_NATIVE_KERNELS=0`` is read first, at each call: nothing is built then)."""
    global _ready
    if os.environ.get(native.ENV, "").strip() == "0":
        return f"{native.ENV}=0 is set"
    if _ready is not None:  # (loaded once, it stays loaded: the hot paths' answer)
        return _ready
    loaded = native.library()
    if isinstance(loaded, str):
        return loaded
    declared = _declared(loaded)
    if not isinstance(declared, str):
        _ready = declared
    return declared


_ready: ctypes.CDLL | None = None


@functools.cache
def _declared(lib: ctypes.CDLL) -> ctypes.CDLL | str:
    i64, i32, ptr, f32 = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p, ctypes.c_float
    try:
        linear = lib.hwplug_linear
        amx = lib.hwplug_linear_amx
        dpbf16 = lib.hwplug_linear_dpbf16
        row = lib.hwplug_linear_row_bf16
        decode = lib.hwplug_paged_decode
        ready = (
            lib.hwplug_linear_simd,
            lib.hwplug_linear_amx_ready,
            lib.hwplug_linear_dpbf16_ready,
            lib.hwplug_linear_row_bf16_ready,
        )
    except AttributeError as error:
        return f"the native library lacks a kernel: {error}"
    linear.restype = i32
    linear.argtypes = [
        ptr, i64, i64, i64,  # x, rows, in features, x's row stride
        ptr, i32, i64, i64,  # weight, its kind, out features, its row stride
        ptr, ptr, i64, i32,  # bias, out, out's row stride, threads
    ]  # fmt: skip
    for pairs in (amx, dpbf16, row):
        pairs.restype = i32
        pairs.argtypes = [
            ptr, i64, i64, i64,  # x (bfloat16), rows, in features, x's row stride
            ptr, i64, i64,  # weight (bfloat16), out features, its row stride
            ptr, ptr, i64,  # bias, out, out's row stride
            i32, i32,  # out is bfloat16 (else float32), threads
        ]  # fmt: skip
    for function in ready:
        function.restype = i32
        function.argtypes = []
    decode.restype = i32
    decode.argtypes = [
        ptr, i32,  # query, its kind
        ptr, ptr, i32, ptr,  # key_cache, value_cache, kind, code values
        i64, i64, i64,  # cache strides: block, position, head
        ptr, i64, ptr,  # block table, its row stride, lengths
        i64, i32, i32, i32, i32,  # n, kv heads, group, head size, block size
        i64, f32, ptr, i32,  # window, scale, out, threads
        ptr, ptr, ptr, i64,  # new keys, new values, their slots, rows
        i64, i64, ptr,  # blocks in the caches, table columns, fault (3 int64)
    ]  # fmt: skip
    return lib


@dataclass(frozen=True)
class Capabilities:
    """What the loaded library can do on this CPU."""

    lanes: int
    """Lanes of the linear kernel's vector path: 16 (AVX-512), 8 (AVX2), 0 (none)."""
    amx: bool
    """bfloat16 products on AMX tiles (built for AMX-BF16 and allowed by the OS)."""
    dpbf16: bool
    """bfloat16 products on AVX-512 BF16 dot products."""
    row_bf16: bool = False
    """One bfloat16 row by a bfloat16 weight on the vector path's one-row tiles
    (``hwplug_linear_row_bf16``: AVX2, or AVX-512 with AVX-512BW)."""


_NONE = Capabilities(0, False, False, False)


def capabilities(lib: ctypes.CDLL | str | None = None) -> Capabilities:
    """What the library (``lib``, default :func:`library`) can do here: all off where it
    cannot run now; remembered once it has loaded."""
    lib = library() if lib is None else lib
    return _NONE if isinstance(lib, str) else _capabilities(lib)


def loaded_capabilities() -> Capabilities:
    """What the library can do, for a hot path whose caller has checked that the kernels
    run now (no second read of the kill switch); all off where nothing is loaded."""
    return _NONE if _ready is None else _capabilities(_ready)


@functools.cache
def _capabilities(lib: ctypes.CDLL) -> Capabilities:
    lanes = int(lib.hwplug_linear_simd())
    return Capabilities(
        lanes if lanes in (8, 16) else 0,
        bool(lib.hwplug_linear_amx_ready()),
        bool(lib.hwplug_linear_dpbf16_ready()),
        bool(lib.hwplug_linear_row_bf16_ready()),
    )


def loaded_library() -> ctypes.CDLL | str:
    """:func:`library` for a caller that has read the kill switch itself (a hot path):
    the library once loaded, without a second read."""
    return _ready if _ready is not None else library()


def _loaded(what: str) -> ctypes.CDLL:
    """The loaded library, for a call whose caller has checked that the kernels run."""
    lib = loaded_library()
    if isinstance(lib, str):
        raise RuntimeError(f"the native {what} kernel cannot run: {lib}")
    return lib


# -- linear ---------------------------------------------------------------------------------


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    *,
    pairs: str | None,
) -> None:
    """``out = x @ weight.T + bias`` on the kernel of ``pairs`` (``"amx"``, ``"dpbf16"``,
    ``"row"`` for one row: bfloat16 ``x``, ``weight`` and a float32 or bfloat16 ``out``)
    or the vector path
    (None: float32 ``out``); every size at least 1. ``weight`` has its last dimension
    contiguous; ``bias`` is float32 ``[out_features]`` or None; ``out`` is
    ``[rows, out_features]`` with its last dimension contiguous and rows apart. ``x`` is
    taken with its row stride, or copied (float32 on the vector path) where its last
    dimension is not contiguous."""
    lib = _loaded("linear")
    rows, inputs = x.shape
    features = weight.shape[0]
    # (the contiguous copy is kept in a name until the call returns: a pointer into a
    # temporary would dangle)
    bias = None if bias is None else bias.contiguous()
    bias_pointer = None if bias is None else bias.data_ptr()
    threads = torch.get_num_threads()
    if pairs is not None:
        x = x if x.stride(1) == 1 else x.contiguous()
        function = _pairs_functions(lib)[pairs]
        status = function(
            x.data_ptr(), rows, inputs, x.stride(0),
            weight.data_ptr(), features, weight.stride(0),
            bias_pointer, out.data_ptr(), out.stride(0),
            int(out.dtype == torch.bfloat16), threads,
        )  # fmt: skip
    else:
        if x.dtype != torch.float32 or x.stride(1) != 1:
            x = x.to(torch.float32).contiguous()
        function = lib.hwplug_linear
        status = function(
            x.data_ptr(), rows, inputs, x.stride(0),
            weight.data_ptr(), LINEAR_KINDS[weight.dtype], features, weight.stride(0),
            bias_pointer, out.data_ptr(), out.stride(0), threads,
        )  # fmt: skip
    if status == 0:
        return
    name = function.__name__
    if status == 1 and pairs in ("amx", "row"):
        raise MemoryError(f"the native linear kernel ({name}) could not allocate its buffer")
    if status == 3:
        raise KernelArgumentError(
            f"the native linear kernel ({name}) refused the sizes: x {list(x.shape)} (row "
            f"stride {x.stride(0)}), weight {list(weight.shape)} (row stride "
            f"{weight.stride(0)}), out {list(out.shape)} (row stride {out.stride(0)})"
        )
    raise RuntimeError(f"the native linear kernel failed ({name}: status {status})")


@functools.cache
def _pairs_functions(lib: ctypes.CDLL) -> dict[str, Any]:
    """The library's bfloat16-pair kernels by path name (looked up once per library)."""
    return {
        "amx": lib.hwplug_linear_amx,
        "dpbf16": lib.hwplug_linear_dpbf16,
        "row": lib.hwplug_linear_row_bf16,
    }


# -- paged decode attention -----------------------------------------------------------------


@functools.cache
def _code_values(dtype: torch.dtype) -> torch.Tensor:
    """The float32 value of each of the 256 codes of an fp8 dtype."""
    return torch.arange(256, dtype=torch.uint8).view(dtype).to(torch.float32)


def in_place_layout(key_cache: torch.Tensor, value_cache: torch.Tensor) -> bool:
    """Whether the kernel reads (and stores into) these caches where they lie: the same
    strides for both, the last dimension contiguous. Others are read from a contiguous
    copy."""
    return key_cache.stride() == value_cache.stride() and key_cache.stride(-1) == 1


_SIZES = (
    "n (sequences)",
    "num_kv_heads",
    "the query heads per key/value head",
    "head_size",
    f"block_size (1..{MAX_BLOCK_SIZE})",
    "num_blocks",
    "the block table's columns",
    "sliding_window",
    "the new rows",
    "the cache kind",
    "a cache or block-table stride",
)


def paged_decode(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    scale: float,
    window: int,
    out: torch.Tensor,
    write: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None,
) -> torch.Tensor:
    """Decode attention into ``out`` (the query's shape and dtype, of
    :data:`QUERY_KINDS`); returns ``out``. ``window`` 0 is none. Every index the kernel
    reads (lengths, block ids of the columns they cover, slots) is checked in C against
    the caches and the table before anything is read or written: a bad one is a
    :class:`~hwplug.kernels.checks.KernelArgumentError`.

    ``write``: the step's new ``(keys, values, slots)`` stored by the same call first:
    keys and values ``[rows, kv_heads, head_size]`` in the cache's own dtype (not fp8),
    slots ``[rows]`` of an integer dtype; caches of :func:`in_place_layout`."""
    lib = _loaded("paged decode")
    n, heads, head_size = query.shape
    blocks, block_size, kv_heads, _ = key_cache.shape
    kind = CACHE_KINDS[key_cache.dtype]
    query = query if query.is_contiguous() else query.contiguous()
    table = block_table
    if table.dtype != torch.int64 or table.stride(-1) != 1:
        table = table.to(torch.int64).contiguous()
    lens = seq_lens if seq_lens.dtype == torch.int64 else seq_lens.to(torch.int64)
    lens = lens if lens.is_contiguous() else lens.contiguous()
    target = out if out.is_contiguous() else torch.empty(out.shape, dtype=out.dtype)
    if not in_place_layout(key_cache, value_cache):
        if write is not None:
            raise KernelArgumentError(
                "the native paged decode kernel stores rows only in caches of one layout "
                "whose last dimension is contiguous"
            )
        key_cache, value_cache = key_cache.contiguous(), value_cache.contiguous()
    keys = values = slots = None
    rows = 0
    if write is not None:
        new_keys, new_values, new_slots = write
        if kind == 3 or new_keys.dtype != key_cache.dtype or new_values.dtype != key_cache.dtype:
            raise KernelArgumentError(
                "the native paged decode kernel stores rows in the cache's own dtype "
                f"({key_cache.dtype}), not fp8; got {new_keys.dtype} and {new_values.dtype}"
            )
        keys, values = new_keys.contiguous(), new_values.contiguous()
        slots = new_slots
        if slots.dtype != torch.int64 or not slots.is_contiguous():
            slots = slots.to(torch.int64).contiguous()
        rows = slots.shape[0]
    codes = _code_values(key_cache.dtype) if kind == 3 else None
    strides = key_cache.stride()
    fault = _Fault()
    status = lib.hwplug_paged_decode(
        query.data_ptr(), QUERY_KINDS[query.dtype],
        key_cache.data_ptr(), value_cache.data_ptr(), kind,
        None if codes is None else codes.data_ptr(),
        strides[0], strides[1], strides[2],
        table.data_ptr(), table.stride(0), lens.data_ptr(),
        n, kv_heads, heads // kv_heads, head_size, block_size,
        window, scale, target.data_ptr(), torch.get_num_threads(),
        None if keys is None else keys.data_ptr(),
        None if values is None else values.data_ptr(),
        None if slots is None else slots.data_ptr(), rows,
        blocks, table.shape[1], fault,
    )  # fmt: skip
    if status != 0:
        raise _decode_error(status, list(fault), blocks, block_size, table.shape[1])
    if target is not out:
        out.copy_(target)
    return out


_Fault = ctypes.c_int64 * 3
"""Where ``hwplug_paged_decode`` says which value was bad (one per call: calls may run
on several threads)."""


def _decode_error(
    status: int, fault: list[int], blocks: int, block_size: int, columns: int
) -> Exception:
    """The Python error of a status of ``hwplug_paged_decode``."""
    where = "the native paged decode kernel"
    if status == 1:
        return MemoryError(f"{where} could not allocate its work buffers")
    if status == 2:
        which = _SIZES[fault[0]] if 0 <= fault[0] < len(_SIZES) else f"size {fault[0]}"
        return KernelArgumentError(f"{where} does not take {which} = {fault[1]}")
    if status == 3:
        return KernelArgumentError(f"{where} takes a float32 or bfloat16 query")
    if status == 4:
        return KernelArgumentError(
            f"{where} does not store rows in an fp8 cache (they need scaling)"
        )
    if status == 5:
        return KernelArgumentError(
            f"seq_lens[{fault[0]}] = {fault[1]} is not a length the block table covers: "
            f"lengths must lie in 1..{columns * block_size} ({columns} columns of "
            f"{block_size} positions)"
        )
    if status == 6:
        return KernelArgumentError(
            f"block_table[{fault[0]}, {fault[1]}] = {fault[2]} is not a block of the caches "
            f"(0..{blocks - 1}); it is read for sequence {fault[0]}'s length"
        )
    if status == 7:
        return KernelArgumentError(
            f"slot {fault[1]} of new row {fault[0]} is past the caches' "
            f"{blocks * block_size} slots ({blocks} blocks of {block_size}); a slot is "
            f"0..{blocks * block_size - 1}, or negative for padding"
        )
    return RuntimeError(f"{where} failed (status {status})")
