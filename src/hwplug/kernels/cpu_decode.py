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

import torch

from hwplug.kernels import bindings, native
from hwplug.kernels.checks import Entry, KernelArgumentError, TensorRule, integer, real

__all__ = [
    "NATIVE_MAX_BLOCK_SIZE",
    "NATIVE_CACHE_DTYPES",
    "NATIVE_QUERY_DTYPES",
    "native_decode_unavailable_reason",
    "paged_decode_attention",
]

NATIVE_MAX_BLOCK_SIZE = bindings.MAX_BLOCK_SIZE
"""The largest block size the kernel takes (its per-page score buffer)."""

NATIVE_CACHE_DTYPES = frozenset(bindings.CACHE_KINDS)
"""The cache dtypes the kernel reads."""
NATIVE_QUERY_DTYPES = frozenset(bindings.QUERY_KINDS)
"""The query dtypes :func:`run` takes as they are (its result in the same dtype)."""

_CACHES = (
    TensorRule(
        "key_cache", ("num_blocks", "block_size", "num_kv_heads", "head_size"), NATIVE_CACHE_DTYPES
    ),
    TensorRule(
        "value_cache",
        ("num_blocks", "block_size", "num_kv_heads", "head_size"),
        NATIVE_CACHE_DTYPES,
        same_dtype_as="key_cache",
    ),
)
DECODE = Entry(
    "paged_decode_attention",
    (
        TensorRule("query", ("n", "num_heads", "head_size"), "float"),
        *_CACHES,
        TensorRule("block_table", ("n", "blocks"), "integer"),
        TensorRule("seq_lens", ("n",), "integer"),
        TensorRule(
            "out",
            ("n", "num_heads", "head_size"),
            frozenset({torch.float32}),
            written=True,
            optional=True,
        ),
    ),
)
"""The arguments :func:`paged_decode_attention` takes."""
STEP = Entry(
    "paged decode step",
    (
        TensorRule("query", ("n", "num_heads", "head_size"), NATIVE_QUERY_DTYPES),
        *(
            TensorRule(r.name, r.dims, r.dtypes, written=True, same_dtype_as=r.same_dtype_as)
            for r in _CACHES
        ),
        TensorRule("block_table", ("n", "blocks"), "integer"),
        TensorRule("seq_lens", ("n",), "integer"),
        TensorRule(
            "out",
            ("n", "num_heads", "head_size"),
            NATIVE_QUERY_DTYPES,
            written=True,
            same_dtype_as="query",
            optional=True,
        ),
        TensorRule(
            "keys",
            ("rows", "num_kv_heads", "head_size"),
            NATIVE_CACHE_DTYPES,
            optional=True,
            same_dtype_as="key_cache",
        ),
        TensorRule(
            "values",
            ("rows", "num_kv_heads", "head_size"),
            NATIVE_CACHE_DTYPES,
            optional=True,
            same_dtype_as="key_cache",
        ),
        TensorRule("slots", ("rows",), "integer", optional=True),
    ),
)
"""The arguments of an engine step's call (:func:`run`): the caches are written too when
the step's rows are stored by the same call."""


def native_decode_unavailable_reason(device: torch.device | str = "cpu") -> str | None:
    """Why the native decode kernel cannot run on ``device``'s tensors, or None when it can.

    It runs on CPU tensors when the kernel has been, or can be, built here and
    ``HWPLUG_NATIVE_KERNELS`` is not ``0`` (read at each call, before anything is
    built). The first call that can run builds the library (a few seconds, once per
    machine).
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
    they are, unscaled), ``block_table`` ``[n, >= blocks]`` integer block ids,
    ``seq_lens`` ``[n]`` integer lengths (the query is each sequence's last
    position). Query head ``h`` reads key/value head ``h // (num_heads //
    num_kv_heads)``. With ``sliding_window`` (an int >= 1) a sequence sees its
    last ``sliding_window`` positions. Any strides. Returns float32 ``[n,
    num_heads, head_size]``, into ``out`` when given (float32, the query's
    shape, any strides whose elements are distinct, sharing no memory with
    the inputs).

    The values are checked by the kernel before it reads anything (lengths in
    ``1..blocks * block_size``, the block ids a length covers in range): a bad
    one is a ``ValueError`` naming it, never a read out of bounds.

    :raises TypeError: an argument of the wrong type (not a tensor, a float window).
    :raises ValueError: a shape, dtype, device, aliasing or value the kernel does not
        take (:class:`~hwplug.kernels.checks.KernelArgumentError`).
    :raises RuntimeError: the kernel cannot run here (the reason says why).
    """
    entry = DECODE.name
    sizes = DECODE.check(
        {
            "query": query,
            "key_cache": key_cache,
            "value_cache": value_cache,
            "block_table": block_table,
            "seq_lens": seq_lens,
            "out": out,
        }
    )
    scale = real(entry, "scale", scale)
    window = (
        0 if sliding_window is None else integer(entry, "sliding_window", sliding_window, low=1)
    )
    _check_heads(entry, sizes)
    reason = native_decode_unavailable_reason(query.device)
    if reason is not None:
        raise RuntimeError(f"the native paged decode kernel cannot run: {reason}")
    target = out if out is not None else torch.empty(query.shape, dtype=torch.float32)
    return bindings.paged_decode(
        query.to(torch.float32),
        key_cache,
        value_cache,
        block_table,
        seq_lens,
        scale=scale,
        window=window,
        out=target,
        write=None,
    )


def _check_heads(entry: str, sizes: dict[str, int]) -> None:
    """The rules between sizes: the query heads a multiple of the key/value heads, a
    block size the kernel takes."""
    heads, kv_heads = sizes["num_heads"], sizes["num_kv_heads"]
    if kv_heads == 0 or heads % kv_heads != 0:
        raise KernelArgumentError(
            f"{entry}: the query's {heads} heads must be a multiple of the caches' "
            f"{kv_heads} key/value heads (num_kv_heads >= 1)"
        )
    block_size = sizes["block_size"]
    if not 1 <= block_size <= NATIVE_MAX_BLOCK_SIZE:
        raise KernelArgumentError(
            f"{entry}: block_size must lie in 1..{NATIVE_MAX_BLOCK_SIZE}; got {block_size}"
        )


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
    """An engine step's decode attention (the torch attention backend's call, once per
    layer): a float32 or bfloat16 ``query`` (see :data:`NATIVE_QUERY_DTYPES`), integer
    ``block_table`` and ``seq_lens``. The result is in the query's dtype (a bfloat16
    query is widened in the kernel, its result rounded to nearest even there: what
    ``.to(torch.bfloat16)`` of the float32 result gives), into ``out`` (the query's shape
    and dtype, any strides) when given. Shapes, dtypes and aliasing are checked here
    (:data:`STEP`, on shapes only), the indices in the kernel: a bad one is a
    ``ValueError``, never an access out of bounds.

    ``write``: the step's new ``(keys, values, slots)``, stored in the caches by the
    same call before anything is read: keys and values ``[rows, kv_heads,
    head_size]`` in the cache's dtype (not fp8: its rows need scaling), integer
    ``slots`` ``[rows]``, each below the caches' slots or negative (a padding row, not
    stored). Row ``i`` goes to slot ``slots[i]`` as
    :func:`hwplug.kernels.reference.write_slots` stores it, without its dispatch of two
    ``index_copy_`` calls."""
    keys, values, slots = write if write is not None else (None, None, None)
    sizes = STEP.check_values(
        (query, key_cache, value_cache, block_table, seq_lens, out, keys, values, slots)
    )
    if write is not None and (keys is None or values is None or slots is None):
        raise TypeError("write must be (keys, values, slots), three tensors")
    _check_heads(STEP.name, sizes)
    window = (
        0 if sliding_window is None else integer(STEP.name, "sliding_window", sliding_window, low=1)
    )
    target = out if out is not None else torch.empty(query.shape, dtype=query.dtype)
    return bindings.paged_decode(
        query,
        key_cache,
        value_cache,
        block_table,
        seq_lens,
        scale=float(scale),
        window=window,
        out=target,
        write=write,
    )


in_place_layout = bindings.in_place_layout


def loaded() -> ctypes.CDLL | str:
    """The native library with the kernel's signature declared, or why it cannot run now."""
    return bindings.library()
