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
import functools

import torch

from hwplug.kernels import native

__all__ = [
    "NATIVE_LINEAR_DTYPES",
    "NATIVE_LINEAR_MAX_ROWS",
    "native_linear",
    "native_linear_amx",
    "native_linear_dpbf16",
    "native_linear_lanes",
    "native_linear_unavailable_reason",
]

_KINDS = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
NATIVE_LINEAR_DTYPES = frozenset(_KINDS)
"""The weight dtypes the kernel reads."""

NATIVE_LINEAR_MAX_ROWS = 64
"""The most rows :func:`hwplug.kernels.linear` (``backend="native"``) ever gives the
kernel; more go to oneDNN, whose blocked GEMM wins there (docs/decisions.md). On a CPU
where oneDNN is stronger (AVX-512, native 16-bit products) it gives fewer:
:func:`hwplug.kernels.linear.native_linear_rows`."""


@functools.cache
def loaded() -> ctypes.CDLL | str:
    """The native library with the kernel's signature declared, or why it cannot run."""
    library = native.library()
    if isinstance(library, str):
        return library
    if library.hwplug_linear_simd() not in (8, 16):
        return "the native linear kernel needs a CPU with AVX2, FMA and F16C"
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    function = library.hwplug_linear
    function.restype = ctypes.c_int
    function.argtypes = [
        ptr, i64, i64, i64,  # x, rows, in features, x's row stride
        ptr, ctypes.c_int, i64, i64,  # weight, its kind, out features, its row stride
        ptr, ptr, i64, ctypes.c_int,  # bias, out, out's row stride, threads
    ]  # fmt: skip
    amx = library.hwplug_linear_amx
    amx.restype = ctypes.c_int
    amx.argtypes = [
        ptr, i64, i64, i64,  # x (bfloat16), rows, in features, x's row stride
        ptr, i64, i64,  # weight (bfloat16), out features, its row stride
        ptr, ptr, i64,  # bias, out, out's row stride
        ctypes.c_int, ctypes.c_int,  # out is bfloat16 (else float32), threads
    ]  # fmt: skip
    dpbf16 = library.hwplug_linear_dpbf16
    dpbf16.restype = ctypes.c_int
    dpbf16.argtypes = amx.argtypes
    return library


@functools.cache
def native_linear_amx() -> bool:
    """Whether bfloat16 products run on AMX tiles here (``csrc/linear_amx.c``): the
    library was built for a CPU with AMX-BF16 and the OS lets this process use them."""
    library = loaded()
    return not isinstance(library, str) and bool(library.hwplug_linear_amx_ready())


@functools.cache
def native_linear_dpbf16() -> bool:
    """Whether bfloat16 products run on AVX-512 BF16 dot products here
    (``csrc/linear_dpbf16.c``): the library was built for a CPU with AVX512_BF16."""
    library = loaded()
    return not isinstance(library, str) and bool(library.hwplug_linear_dpbf16_ready())


def pairs_path(x: torch.Tensor, weight: torch.Tensor) -> str | None:
    """The path that multiplies this product's bfloat16 pairs, or None (the vector path
    takes it): ``"amx"`` for a bfloat16 ``x`` and weight whose in features are a multiple
    of 32 and out features of 16 on a CPU where AMX runs, else ``"dpbf16"`` for a
    bfloat16 ``x`` and weight on a CPU with AVX-512 BF16."""
    if x.dtype != torch.bfloat16 or weight.dtype != torch.bfloat16:
        return None
    if weight.shape[1] % 32 == 0 and weight.shape[0] % 16 == 0 and native_linear_amx():
        return "amx"
    return "dpbf16" if native_linear_dpbf16() else None


def native_linear_lanes() -> int:
    """The lanes of k the kernel multiplies at a time: 16 where it was built for AVX-512,
    8 for AVX2, 0 where it cannot run."""
    library = loaded()
    return 0 if isinstance(library, str) else int(library.hwplug_linear_simd())


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
    :data:`NATIVE_LINEAR_DTYPES` with its last dimension contiguous, ``bias``
    ``[out_features]`` or None. Returns float32 ``[rows, out_features]`` (into
    ``out`` when given: float32, that shape, its last dimension contiguous).

    :raises ValueError: a shape, dtype, layout or device the kernel does not take.
    :raises RuntimeError: the kernel cannot run here (the reason says why).
    """
    reason = native_linear_unavailable_reason(x.device)
    if reason is not None:
        raise RuntimeError(f"the native linear kernel cannot run: {reason}")
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(
            "x must be [rows, in_features] and weight [out_features, in_features]; got "
            f"{list(x.shape)} and {list(weight.shape)}"
        )
    if weight.dtype not in _KINDS or not x.dtype.is_floating_point:
        allowed = ", ".join(sorted(str(d).removeprefix("torch.") for d in _KINDS))
        raise ValueError(
            f"weight must be one of {allowed} and x a float tensor; got "
            f"{str(weight.dtype).removeprefix('torch.')} and {str(x.dtype).removeprefix('torch.')}"
        )
    if weight.stride(1) != 1 and weight.numel() > 0:
        raise ValueError("weight's last dimension must be contiguous (it is read as it lies)")
    rows, features = x.shape[0], weight.shape[0]
    if bias is not None and (bias.shape != (features,) or not bias.dtype.is_floating_point):
        raise ValueError(f"bias must be a float [{features}] tensor; got {list(bias.shape)}")
    if out is not None and (
        out.shape != (rows, features)
        or out.dtype != torch.float32
        or (out.numel() > 0 and out.stride(1) != 1)
        or (rows > 1 and out.stride(0) < features)
    ):
        raise ValueError(
            f"out must be float32 [{rows}, {features}] with its last dimension contiguous "
            "and rows that do not overlap; "
            f"got {list(out.shape)} of {out.dtype}"
        )
    devices = {t.device.type for t in (x, weight, bias, out) if t is not None}
    if devices != {"cpu"}:
        raise ValueError(f"every tensor must be on the CPU; got {sorted(devices)}")
    return run(x, weight, None if bias is None else bias.float(), out)


def run(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor | None = None,
    *,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """The kernel on checked arguments: 2-D ``x``, a weight of a supported dtype with its
    last dimension contiguous, a float32 ``bias`` or None. The result is float32, or
    ``dtype``: the AMX and AVX-512 BF16 paths write bfloat16 themselves (rounded to
    nearest even, as ``.to(torch.bfloat16)`` of the float32 result rounds), others
    convert. ``out``, when
    given, is float32."""
    library = loaded()
    if isinstance(library, str):
        raise RuntimeError(f"the native linear kernel cannot run: {library}")
    rows, inputs = x.shape
    features = weight.shape[0]
    pairs = pairs_path(x, weight) if rows > 0 and features > 0 and inputs > 0 else None
    if out is None:
        direct = pairs is not None and dtype == torch.bfloat16
        out = torch.empty((rows, features), dtype=dtype if direct else torch.float32)
    if rows == 0 or features == 0:
        return out.to(dtype)
    if inputs == 0:
        out = out.copy_(bias.expand(rows, features)) if bias is not None else out.zero_()
        return out.to(dtype)
    if bias is not None and not bias.is_contiguous():
        bias = bias.contiguous()
    bias_pointer = None if bias is None else bias.data_ptr()
    threads = torch.get_num_threads()
    if pairs is not None:
        # bfloat16 pairs multiplied on AMX tiles or by AVX-512 BF16 dot products (exact
        # products, float32 sums)
        x = x if x.stride(1) == 1 else x.contiguous()
        function = library.hwplug_linear_amx if pairs == "amx" else library.hwplug_linear_dpbf16
        rc = function(
            x.data_ptr(), rows, inputs, x.stride(0),
            weight.data_ptr(), features, weight.stride(0),
            bias_pointer, out.data_ptr(), out.stride(0),
            int(out.dtype == torch.bfloat16), threads,
        )  # fmt: skip
    else:
        if x.dtype != torch.float32 or x.stride(1) != 1:
            x = x.to(torch.float32, memory_format=torch.contiguous_format).contiguous()
        function = library.hwplug_linear
        rc = function(
            x.data_ptr(), rows, inputs, x.stride(0),
            weight.data_ptr(), _KINDS[weight.dtype], features, weight.stride(0),
            bias_pointer, out.data_ptr(), out.stride(0), threads,
        )  # fmt: skip
    if rc != 0:
        raise RuntimeError(f"the native linear kernel failed ({function.__name__}: status {rc})")
    return out.to(dtype)
