"""Kernels: fp8 KV-cache kernels (Triton and a pure-torch reference) and dense linears.

Public entry points:

- :func:`compute_kv_scales` derives per-tensor fp8 scales from keys and values
  (this is what ``CacheConfig.calculate_kv_scales=True`` uses);
- :func:`write_kv_cache` stores keys and values into a paged cache, quantising
  to fp8 when the cache is fp8;
- :func:`gather_kv_cache` reads them back;
- :func:`linear` multiplies by a linear layer's weight on the GEMM a platform
  names (``Platform.linear_backend``: on CPUs ``"native"``, the native kernel
  :func:`native_linear` for few rows and oneDNN for more);
- :func:`paged_decode_attention` attends decoding sequences straight from a
  paged cache on CPUs (the native kernels are built at first use: see
  :mod:`hwplug.kernels.native`).

Every native entry checks its arguments before a pointer reaches C: a bad
one is a :class:`KernelArgumentError` (a ``ValueError``; a wrong type is a
:class:`KernelTypeError`, also a ``TypeError``) naming the argument, its
value and what is allowed, and the indices a kernel reads from a tensor are
bounded in C. The package reads as three layers:

- entry points and their rules: :mod:`~hwplug.kernels.linear`,
  :mod:`~hwplug.kernels.cpu_linear`, :mod:`~hwplug.kernels.cpu_decode`,
  :mod:`~hwplug.kernels.paged_kv`, with :mod:`~hwplug.kernels.checks` (the
  rules of each entry, stated once);
- the ctypes marshalling: :mod:`~hwplug.kernels.bindings` (the only module
  that hands a pointer to C), over :mod:`~hwplug.kernels.native` (building,
  caching and loading the library);
- the C sources: ``csrc/``.

The kernels take tensors, dtypes and plain values only: they look up no
session or platform (a caller that knows its platform passes what it says,
such as ``runs_triton``).

Importing this package imports torch but not triton: Triton is loaded only
when a Triton kernel is about to run.
"""

from __future__ import annotations

from hwplug.kernels.checks import KernelArgumentError, KernelTypeError
from hwplug.kernels.cpu_decode import (
    NATIVE_CACHE_DTYPES,
    NATIVE_MAX_BLOCK_SIZE,
    native_decode_unavailable_reason,
    paged_decode_attention,
)
from hwplug.kernels.cpu_linear import (
    NATIVE_LINEAR_DTYPES,
    NATIVE_LINEAR_MAX_ROWS,
    native_linear,
    native_linear_amx,
    native_linear_dpbf16,
    native_linear_lanes,
    native_linear_unavailable_reason,
)
from hwplug.kernels.formats import (
    CACHE_DTYPES,
    FP8_FORMATS,
    INPUT_DTYPES,
    Fp8Format,
    fp8_format,
    fp8_max,
    is_fp8,
)
from hwplug.kernels.linear import LINEAR_BACKENDS, linear, native_linear_rows
from hwplug.kernels.paged_kv import (
    BACKENDS,
    TRITON_DEVICE_TYPES,
    compute_kv_scales,
    gather_kv_cache,
    select_backend,
    triton_unavailable_reason,
    write_kv_cache,
)

__all__ = [
    "BACKENDS",
    "CACHE_DTYPES",
    "FP8_FORMATS",
    "INPUT_DTYPES",
    "KernelArgumentError",
    "KernelTypeError",
    "LINEAR_BACKENDS",
    "NATIVE_CACHE_DTYPES",
    "NATIVE_LINEAR_DTYPES",
    "NATIVE_LINEAR_MAX_ROWS",
    "NATIVE_MAX_BLOCK_SIZE",
    "TRITON_DEVICE_TYPES",
    "Fp8Format",
    "compute_kv_scales",
    "fp8_format",
    "fp8_max",
    "gather_kv_cache",
    "is_fp8",
    "linear",
    "native_decode_unavailable_reason",
    "native_linear",
    "native_linear_amx",
    "native_linear_dpbf16",
    "native_linear_lanes",
    "native_linear_unavailable_reason",
    "native_linear_rows",
    "paged_decode_attention",
    "select_backend",
    "triton_unavailable_reason",
    "write_kv_cache",
]
