"""Few-row linears on CPUs, read straight from the weight (``csrc/linear.c``).

Decoding multiplies a handful of rows (one per running sequence) by every
weight of the model on each step. oneDNN's inner product on a weight in
its plain layout re-blocks it on every call; packing it once into oneDNN's
layout is faster but keeps a second copy (or loses in-place updates of the
weight). This kernel reads the weight as it lies, row-major 32- or 16-bit
floats (16-bit widened in registers, no float32 copy), four rows of the
input at a time (eight with AVX-512), the next weight rows prefetched while
the current ones are multiplied, so an update of the weight is seen by the
next call and no copy is kept. Products are summed in float32.

It needs a CPU with AVX2, FMA and F16C (the library is built with
``-march=native``; on a CPU with AVX-512F it uses 512-bit registers);
elsewhere, or when the native kernels cannot be built or
``HWPLUG_NATIVE_KERNELS=0`` is set, :func:`native_linear_unavailable_reason`
says why. :func:`hwplug.kernels.linear` with ``backend="native"`` (the CPU
platform's ``linear_backend``) takes it for up to
:func:`hwplug.kernels.linear.native_linear_rows` rows (at most
:data:`NATIVE_LINEAR_MAX_ROWS`) and oneDNN beyond.

On a CPU with AMX-BF16 (:func:`native_linear_amx`), a bfloat16 input times a
bfloat16 weight whose in features are a multiple of 32 and out features of
16 runs on AMX tiles instead (``csrc/linear_amx.c``): sixteen weight rows
load into a tile as they lie and the few input rows are laid out for the
tile product once a call, so the weight is still read once and never copied.
The products of bfloat16 pairs are exact and summed in float32 (AMX treats
bfloat16 subnormals, below about 1e-38, as zero).
"""

from __future__ import annotations

import ctypes
import os
from typing import Literal

import torch

from hwplug.kernels import bindings, native
from hwplug.kernels.checks import Entry, TensorRule

__all__ = [
    "NATIVE_LINEAR_DTYPES",
    "NATIVE_LINEAR_MAX_ROWS",
    "native_linear",
    "native_linear_amx",
    "native_linear_dpbf16",
    "native_linear_lanes",
    "native_linear_unavailable_reason",
]

NATIVE_LINEAR_DTYPES = frozenset(bindings.LINEAR_KINDS)
"""The weight dtypes the kernel reads."""

NATIVE_LINEAR_MAX_ROWS = 64
"""The most rows :func:`hwplug.kernels.linear` (``backend="native"``) ever gives the
kernel; more go to oneDNN, whose blocked GEMM wins there (docs/decisions.md). On a CPU
where oneDNN is stronger (AVX-512, native 16-bit products) it gives fewer:
:func:`hwplug.kernels.linear.native_linear_rows`."""

LINEAR = Entry(
    "native_linear",
    (
        TensorRule("x", ("rows", "in_features"), "float"),
        TensorRule("weight", ("out_features", "in_features"), NATIVE_LINEAR_DTYPES),
        TensorRule("bias", ("out_features",), "float", optional=True),
        TensorRule(
            "out", ("rows", "out_features"), frozenset({torch.float32}), written=True, optional=True
        ),
    ),
)
"""The arguments :func:`native_linear` takes (a bias of one element is broadcast first)."""


def loaded() -> ctypes.CDLL | str:
    """The native library with the kernel's signature declared, or why it cannot run now."""
    library = bindings.library()
    if isinstance(library, str):
        return library
    if bindings.capabilities(library).lanes == 0:
        return "the native linear kernel needs a CPU with AVX2, FMA and F16C"
    return library


def runs() -> bool:
    """Whether the kernel runs on CPU tensors now (a hot path's question: the kill switch
    read once, nothing else asked of the environment)."""
    if os.environ.get(native.ENV, "").strip() == "0":
        return False
    library = bindings.loaded_library()
    return not isinstance(library, str) and bindings.capabilities(library).lanes != 0


def native_linear_amx() -> bool:
    """Whether bfloat16 products run on AMX tiles here (``csrc/linear_amx.c``): the
    library was built for a CPU with AMX-BF16 and the OS lets this process use them."""
    return bindings.capabilities().amx


def native_linear_dpbf16() -> bool:
    """Whether bfloat16 products run on AVX-512 BF16 dot products here
    (``csrc/linear_dpbf16.c``): the library was built for a CPU with AVX512_BF16."""
    return bindings.capabilities().dpbf16


def pairs_path(x: torch.Tensor, weight: torch.Tensor) -> str | None:
    """The path that multiplies this product's bfloat16 pairs, or None (the vector path
    takes it): ``"amx"`` for a bfloat16 ``x`` and weight whose in features are a multiple
    of 32 and out features of 16 on a CPU where AMX runs, else ``"dpbf16"`` for a
    bfloat16 ``x`` and weight on a CPU with AVX-512 BF16, else ``"row"`` for one
    bfloat16 row (a decoding step of one sequence) where the vector path has its
    one-row tiles: x widened once in the kernel, the result written in bfloat16 there,
    no conversion op on either side."""
    if x.dtype != torch.bfloat16 or weight.dtype != torch.bfloat16:
        return None
    can = bindings.loaded_capabilities()  # (callers have read the kill switch)
    if weight.shape[1] % 32 == 0 and weight.shape[0] % 16 == 0 and can.amx:
        return "amx"
    if can.dpbf16:
        return "dpbf16"
    return "row" if can.row_bf16 and x.shape[0] == 1 else None


def native_linear_lanes() -> int:
    """The lanes of k the kernel multiplies at a time: 16 where it was built for AVX-512,
    8 for AVX2, 0 where it cannot run."""
    return bindings.capabilities().lanes


def native_linear_unavailable_reason(device: torch.device | str = "cpu") -> str | None:
    """Why the native linear kernel cannot run on ``device``'s tensors, or None when it can."""
    return native.unavailable_reason(device, "linear", loaded)


def native_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x @ weight.T + bias`` in float32, read from ``weight`` where it lies.

    ``x`` is ``[rows, in_features]`` (any float dtype; computed in float32),
    ``weight`` ``[out_features, in_features]`` in a dtype of
    :data:`NATIVE_LINEAR_DTYPES` (any strides: a weight whose last dimension is
    not contiguous is read from a contiguous copy), ``bias`` ``[out_features]``
    (or one element, broadcast) or None. Returns float32 ``[rows,
    out_features]``, into ``out`` when given: float32, that shape, any strides
    whose elements are distinct, sharing no memory with ``x``, ``weight`` or
    ``bias``.

    :raises TypeError: an argument that is not a tensor.
    :raises ValueError: a shape, dtype, device or aliasing the kernel does not take
        (:class:`~hwplug.kernels.checks.KernelArgumentError`, which names it).
    :raises RuntimeError: the kernel cannot run here (the reason says why).
    """
    if (
        isinstance(bias, torch.Tensor)
        and bias.numel() == 1
        and bias.dim() <= 1
        and isinstance(weight, torch.Tensor)
        and weight.dim() == 2
    ):
        bias = bias.reshape(1).expand(weight.shape[0])
    LINEAR.check({"x": x, "weight": weight, "bias": bias, "out": out})
    reason = native_linear_unavailable_reason(x.device)
    if reason is not None:
        raise RuntimeError(f"the native linear kernel cannot run: {reason}")
    if weight.stride(1) != 1 and weight.numel() > 0:
        weight = weight.contiguous()
    return run(x, weight, None if bias is None else bias.float(), out)


def run(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor | None = None,
    *,
    dtype: torch.dtype = torch.float32,
    pairs: str | Literal[False] | None = False,
) -> torch.Tensor:
    """The kernel on arguments that have passed :data:`LINEAR`: 2-D ``x``, a weight of a
    supported dtype with its last dimension contiguous, a float32 ``bias`` or None. The
    result is float32, or ``dtype``: the AMX and AVX-512 BF16 paths write bfloat16
    themselves (rounded to nearest even, as ``.to(torch.bfloat16)`` of the float32
    result rounds), others convert. ``out``, when given, is float32. ``pairs``: what
    :func:`pairs_path` says of these arguments, when the caller has asked it already
    (False: ask it here)."""
    rows, inputs = x.shape
    features = weight.shape[0]
    if rows == 0 or features == 0 or inputs == 0:
        pairs = None
    elif pairs is False:
        pairs = pairs_path(x, weight)
    given = out
    if out is not None and not _rows_writable(out):
        out = None  # computed into a buffer of its own, then copied in
    if out is None:
        direct = pairs is not None and dtype == torch.bfloat16 and given is None
        out = torch.empty((rows, features), dtype=dtype if direct else torch.float32)
    if rows > 0 and features > 0:
        if inputs > 0:
            bindings.linear(x, weight, bias, out, pairs=pairs)
        elif bias is not None:  # an empty product: the bias alone
            out.copy_(bias.expand(rows, features))
        else:
            out.zero_()
    if given is not None and given is not out:
        given.copy_(out)
        out = given
    return out if out.dtype == dtype else out.to(dtype)


def _rows_writable(out: torch.Tensor) -> bool:
    """Whether the kernel writes ``out`` where it lies: its last dimension contiguous and
    its rows apart."""
    rows, features = out.shape
    return out.numel() == 0 or (
        (features <= 1 or out.stride(1) == 1) and (rows <= 1 or out.stride(0) >= features)
    )
