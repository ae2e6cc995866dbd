"""Dense linear layers (``x @ weight.T + bias``) on the GEMM a platform names.

:func:`linear` is what an engine's linear layers call, with the backend
their platform gives (``Platform.linear_backend``):

- ``"torch"``: ``torch.nn.functional.linear`` (the BLAS torch was built with);
- ``"native"``: hwplug's CPU kernel (:mod:`hwplug.kernels.cpu_linear`) for
  up to :func:`native_linear_rows` rows (decoding steps; how many depends on the
  CPU and the dtype), oneDNN's inner product beyond (prefills). The kernel
  reads 32- and 16-bit weights as they lie and multiplies four rows (eight
  with AVX-512) at a time in registers. Measured (docs/decisions.md): on an
  AVX2 CPU (Zen 1), 1.2-1.7x faster than oneDNN for 1-32 rows in float32 and
  2-3.5x faster than oneDNN's float32 product of 16-bit weights; on an
  AVX-512 CPU with AMX, 1.4-2.1x faster for 2-16 rows in float32 and level
  to 32 rows (about level for one row); there bfloat16 products of up to 32
  rows run on AMX tiles, the weight read as it lies (1.2-2.9x oneDNN's
  bfloat16 product). Where the kernel cannot run (no AVX2/FMA/F16C, no compiler,
  ``HWPLUG_NATIVE_KERNELS=0``, a weight whose rows are not contiguous) it
  is ``"onednn"``;
- ``"onednn"``: oneDNN's inner product, on CPUs. It reads the weight where
  it lies, in its own layout (no packed or converted copy is made or kept),
  so an in-place update of the weight is seen by the next call. On the
  x86 CPUs we measured, it is 1.3-3.6x faster than torch's MKL GEMM for the
  few-row products of decoding (see docs/peers.md). 16-bit inputs on a CPU
  without native 16-bit oneDNN kernels are computed in float32, the weight
  converted a cache-sized piece at a time (torch's own 16-bit GEMM there
  is several times slower for more than a couple of rows), and the result
  is rounded to the input's dtype; one or two rows take torch's 16-bit
  product, which reads the 16-bit weight once.

Both read the weight where it lies (no packed or converted copy is made or
kept), so an in-place update of the weight is seen by the next call. A
backend that cannot run a call (no oneDNN in this torch build, a tensor on
another device, a dtype it lacks, autograd recording) falls back to
``"torch"``: the result is the same product either way. Under
``torch.compile`` each is one opaque custom op (``hwplug::native_linear``,
``hwplug::onednn_linear``) that picks its path from the rows at run time.
"""

from __future__ import annotations

import functools
from typing import Literal, NoReturn

import torch

from hwplug.kernels import cpu_linear, op_door
from hwplug.kernels.checks import Entry, KernelArgumentError, TensorRule
from hwplug.kernels.scratch import scratch

__all__ = ["LINEAR_BACKENDS", "linear", "native_linear_rows", "onednn_dtypes"]

LINEAR_BACKENDS = ("torch", "native", "onednn")
"""The backends :func:`linear` knows."""

_HAS_ONEDNN = torch.backends.mkldnn.is_available()
_ONEDNN_INPUTS = (torch.float32, torch.bfloat16, torch.float16)


@functools.cache
def onednn_dtypes() -> frozenset[torch.dtype]:
    """The dtypes oneDNN multiplies natively on this CPU (empty without oneDNN)."""
    if not _HAS_ONEDNN:
        return frozenset()
    native = {torch.float32}
    ops = torch.ops.mkldnn
    if ops._is_mkldnn_bf16_supported():
        native.add(torch.bfloat16)
    if ops._is_mkldnn_fp16_supported():
        native.add(torch.float16)
    return frozenset(native)


_UPCAST_BYTES = 4 << 20
"""Float32 bytes of a 16-bit weight converted at a time (a cache-sized piece)."""
_GEMV_ROWS = 2
"""Up to this many rows of a 16-bit input without native oneDNN kernels go to torch's
own 16-bit product: a matrix-vector product that reads the 16-bit weight once."""


def _onednn(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """oneDNN's product of a 2-D ``x``; 16-bit inputs it lacks run in float32 (torch's
    product where this torch has no oneDNN)."""
    if not _HAS_ONEDNN:
        return torch.nn.functional.linear(x, weight, bias)
    if x.dtype in onednn_dtypes():
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), weight, bias, "none", [], "")
    if x.shape[0] <= _GEMV_ROWS:
        return torch.nn.functional.linear(x, weight, bias)
    return _upcast(x, weight, bias)


def _upcast(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The float32 product of 16-bit operands, the weight converted a cache-sized piece
    of output features at a time (converting it whole would write and read a float32
    copy the size of the weight on every call), rounded to the input's dtype."""
    rows = x.float().contiguous()
    features, inputs = weight.shape
    piece = max(1, _UPCAST_BYTES // (4 * inputs))
    out = torch.empty((rows.shape[0], features), dtype=torch.float32, device=x.device)
    buffer = scratch.get("linear.upcast", (min(piece, features) * inputs,), torch.float32, x.device)
    for start in range(0, features, piece):
        part = weight[start : start + piece]
        converted = buffer[: part.numel()].view(part.shape).copy_(part)
        out[:, start : start + part.shape[0]] = torch.ops.mkldnn._linear_pointwise(
            rows, converted, None, "none", [], ""
        )
    if bias is not None:
        out += bias.float()
    return out.to(x.dtype)


_NATIVE_AVX512_ROWS = 32
"""Float32 rows the kernel takes where it was built for AVX-512 (oneDNN's AVX-512 GEMM
catches up at 32-40 rows since the kernel's 8-row tiles)."""
_NATIVE_16BIT_ROWS = 4
"""Rows of a 16-bit weight the kernel takes where oneDNN multiplies that dtype natively
(on AMX, oneDNN was faster from 8 rows)."""
_NATIVE_AMX_ROWS = 32
"""Rows of bfloat16 the kernel's AMX path takes (1.2-2.9x oneDNN up to 32 rows on the
AMX Xeon we measured, about level from 64 rows on some shapes)."""
_NATIVE_DPBF16_ROWS = 32
"""Rows of bfloat16 the kernel's AVX-512 BF16 path takes (on a Zen 4, weights read from
memory: 0.9-2.4x oneDNN at 1-16 rows, most over 1.3x; 1.07-1.5x at 32; behind from 64)."""
_PAIRS_ROWS = {"amx": _NATIVE_AMX_ROWS, "dpbf16": _NATIVE_DPBF16_ROWS, "row": 1}


def native_linear_rows(dtype: torch.dtype) -> int:
    """Up to how many rows backend ``"native"`` gives hwplug's kernel a weight of
    ``dtype`` on this CPU (more go to oneDNN; 0 where the kernel cannot run).

    Where the two cross was measured (docs/decisions.md): with AVX2 only, oneDNN's
    blocked GEMM catches up between 64 and 128 rows, so the kernel takes up to
    :data:`~hwplug.kernels.cpu_linear.NATIVE_LINEAR_MAX_ROWS`; on a CPU with
    AVX-512, about 32 rows in float32; and a 16-bit weight on a CPU where oneDNN
    multiplies that dtype natively (AVX-512 BF16/FP16, AMX) goes to oneDNN beyond
    4 rows. A 16-bit weight without native oneDNN kernels stays on the kernel up to
    the maximum: oneDNN would compute it in float32 from converted pieces. Where the
    kernel multiplies bfloat16 on AMX tiles (:func:`~hwplug.kernels.native_linear_amx`)
    it takes up to 32 rows of a bfloat16 input whose weight's shape the tiles take (in
    features a multiple of 32, out features of 16; other shapes: 4 rows, or 32 where
    the next path runs). Where it multiplies bfloat16 pairs with AVX-512 BF16 dot
    products (:func:`~hwplug.kernels.native_linear_dpbf16`: a CPU with AVX512_BF16,
    such as AMD Zen 4) it takes up to 32 rows of a bfloat16 input and weight.
    """
    if not _native_runs():
        return 0
    if dtype == torch.bfloat16 and cpu_linear.native_linear_amx():
        return _NATIVE_AMX_ROWS
    if dtype == torch.bfloat16 and cpu_linear.native_linear_dpbf16():
        return _NATIVE_DPBF16_ROWS
    return _vector_rows(dtype)


@functools.cache
def _vector_rows(dtype: torch.dtype) -> int:
    """Up to how many rows of ``dtype`` the kernel's vector path beats oneDNN here (asked
    only where the kernel runs, so the answer holds for the process)."""
    lanes = cpu_linear.native_linear_lanes()
    if lanes == 0 or dtype not in cpu_linear.NATIVE_LINEAR_DTYPES:
        return 0
    if dtype != torch.float32:
        return _NATIVE_16BIT_ROWS if dtype in onednn_dtypes() else cpu_linear.NATIVE_LINEAR_MAX_ROWS
    return _NATIVE_AVX512_ROWS if lanes == 16 else cpu_linear.NATIVE_LINEAR_MAX_ROWS


def _native(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The native kernel's product of a 2-D ``x`` for few rows, oneDNN's for more."""
    # the kill switch first: nothing below may build the kernels while it is set
    if not _native_runs():
        return _onednn(x, weight, bias)
    # products the AMX tiles or the BF16 dot products take have their own limits; the
    # rest the vector path's
    pairs = cpu_linear.pairs_path(x, weight)
    limit = _PAIRS_ROWS[pairs] if pairs is not None else _vector_rows(weight.dtype)
    if x.shape[0] > limit:
        return _onednn(x, weight, bias)
    return cpu_linear.run(
        x, weight, None if bias is None else bias.float(), dtype=x.dtype, pairs=pairs
    )


def _native_runs() -> bool:
    return cpu_linear.runs()


def _native_op(x: object, weight: object, bias: object, *, load: bool = False) -> torch.Tensor:
    """The validated door of ``hwplug::native_linear``: the call checked, computed, and its
    layout approved for the C++ door where that door runs it as this one does.
    ``load``: load the C++ door first if it is not (the op's own kernel)."""
    door = op_door.open_door() if load else op_door.active()
    given = weight
    x, weight, bias = _op_arguments("native_linear", x, weight, bias)
    out = _native(x, weight, bias)
    if door:
        path = _door_path(x, weight, bias, out)
        if path is not False and weight is given:  # (not a contiguous copy made here)
            op_door.approve(x, weight, bias, path, out.dtype)
    return out


def _door_path(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor
) -> str | Literal[False] | None:
    """The kernel path the C++ door may run this checked call on exactly as
    :func:`_native` did (None: the vector path, whose 16-bit rows the door widens to
    float32 and whose result it rounds back, as :mod:`~hwplug.kernels.bindings` does),
    or False where it may not: a call :func:`_native` gave to oneDNN, an empty product,
    ``x`` or the weight not contiguous along a row, or a bias that is not float32 and
    contiguous."""
    rows, inputs = x.shape
    if rows == 0 or inputs == 0 or weight.shape[0] == 0 or not _native_runs():
        return False
    if x.stride(1) != 1 or weight.stride(1) != 1:
        return False
    if bias is not None and (bias.dtype != torch.float32 or bias.stride(0) != 1):
        return False
    pairs = cpu_linear.pairs_path(x, weight)
    limit = _PAIRS_ROWS[pairs] if pairs is not None else _vector_rows(weight.dtype)
    if rows > limit:
        return False
    if out.dtype != x.dtype:
        return False
    return pairs


def _op_arguments(
    op: str, x: object, weight: object, bias: object
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The arguments of ``hwplug::native_linear`` or ``hwplug::onednn_linear`` once
    checked, since anyone may call the ops (``torch.ops.hwplug...``), not only
    :func:`linear`: ``x`` ``[rows, in_features]`` and ``weight`` ``[out_features,
    in_features]`` dense CPU tensors of one dtype of :data:`_ONEDNN_INPUTS`, ``bias``
    None or a dense CPU float ``[out_features]``. The native op takes a weight whose
    last dimension is not contiguous from a contiguous copy (the kernel reads rows).

    :raises KernelArgumentError: the first argument that breaks a rule, named with
        what was given and what is allowed (a :class:`~hwplug.kernels.checks.
        KernelTypeError` for one that is not a tensor).
    """
    if not (
        isinstance(x, torch.Tensor)
        and isinstance(weight, torch.Tensor)
        and x.dim() == 2
        and weight.dim() == 2
        and x.shape[1] == weight.shape[1]
        and x.dtype == weight.dtype
        and x.dtype in _ONEDNN_INPUTS
        and x.is_cpu
        and weight.is_cpu
        and x.layout == torch.strided
        and weight.layout == torch.strided
        and (
            bias is None
            or (
                isinstance(bias, torch.Tensor)
                and bias.dim() == 1
                and bias.shape[0] == weight.shape[0]
                and bias.dtype.is_floating_point
                and bias.is_cpu
                and bias.layout == torch.strided
            )
        )
    ):
        _refuse(op, x, weight, bias)
    if op == "native_linear" and weight.stride(1) != 1 and weight.numel() > 0:
        weight = weight.contiguous()
    return x, weight, bias


_OP_RULES = (
    TensorRule("x", ("rows", "in_features"), frozenset(_ONEDNN_INPUTS)),
    TensorRule("weight", ("out_features", "in_features"), "float", same_dtype_as="x"),
    TensorRule("bias", ("out_features",), "float", optional=True),
)
_OP_ENTRIES = {op: Entry(f"hwplug::{op}", _OP_RULES) for op in ("native_linear", "onednn_linear")}
"""The rules :func:`_refuse` names a broken one of, per op."""


def _refuse(op: str, x: object, weight: object, bias: object) -> NoReturn:
    """Raise the error that names what is wrong with an op call :func:`_op_arguments`
    did not take."""
    _OP_ENTRIES[op].check({"x": x, "weight": weight, "bias": bias})
    # (the rules above cover every case the fast test refuses; this is a backstop)
    raise KernelArgumentError(
        f"hwplug::{op}: x [rows, in_features], weight [out_features, in_features] and bias "
        "[out_features] or None must be dense CPU tensors of one dtype (float32, bfloat16 or "
        "float16; a float bias)"
    )


def _fake_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty((x.shape[0], weight.shape[0]))


# Defined on a torch.library fragment with one kernel for every device
# (CompositeExplicitAutograd) and a fake for tracing, as the attention op is:
# ``torch.library.custom_op`` would add a Python autograd layer and output-alias
# checks to each call (about 11 us on a CPU, measured: 17 linears a step of a
# small model) that these ops never need, since a call that records autograd
# takes torch's path before it reaches them (:func:`_runs_cpu`).
_LIBRARY = torch.library.Library("hwplug", "FRAGMENT")
_SCHEMA = "(Tensor x, Tensor weight, Tensor? bias) -> Tensor"
_LIBRARY.define("native_linear" + _SCHEMA)
_LIBRARY.define("native_linear_checked" + _SCHEMA)
_LIBRARY.define("onednn_linear" + _SCHEMA)
# (the kernels look the functions up when called, so that a profiler that wraps them sees
# the compiled model's calls too). ``native_linear``'s CPU calls go to the C++ door once
# it is loaded (hwplug.kernels.op_door), which hands what it has not seen approved to
# ``native_linear_checked``; until then (and where it cannot be built) this kernel takes
# them, loading the door at its first call.
_LIBRARY.impl(
    "native_linear", lambda x, w, b: _native_op(x, w, b, load=True), "CompositeExplicitAutograd"
)
_LIBRARY.impl(
    "native_linear_checked", lambda x, w, b: _native_op(x, w, b), "CompositeExplicitAutograd"
)
_LIBRARY.impl(
    "onednn_linear",
    lambda x, w, b: _onednn(*_op_arguments("onednn_linear", x, w, b)),
    "CompositeExplicitAutograd",
)
torch.library.register_fake("hwplug::native_linear", _fake_linear, lib=_LIBRARY)
torch.library.register_fake("hwplug::native_linear_checked", _fake_linear, lib=_LIBRARY)
torch.library.register_fake("hwplug::onednn_linear", _fake_linear, lib=_LIBRARY)


def _runs_cpu(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, backend: str
) -> bool:
    """Whether ``backend`` ("native" or "onednn") can take this call."""
    if x.device.type != "cpu" or weight.device.type != "cpu" or weight.dim() != 2:
        return False
    if x.dtype != weight.dtype or (bias is not None and bias.dtype != x.dtype):
        return False
    if x.dtype not in _ONEDNN_INPUTS or (backend == "onednn" and not _HAS_ONEDNN):
        return False
    if x.is_mkldnn or weight.is_mkldnn or x.is_sparse or weight.is_sparse:
        return False
    if weight.shape[0] == 0 or weight.shape[1] == 0:  # (static sizes: no guard on the rows)
        return False
    # oneDNN's inner product has no backward: keep autograd on torch's path
    return not (
        torch.is_grad_enabled()
        and (x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad))
    )


LINEAR = Entry(
    "linear",
    (
        TensorRule("x", ("rows", "in_features"), "float"),
        TensorRule("weight", ("out_features", "in_features"), "float", same_dtype_as="x"),
    ),
)
"""The arguments ``linear(..., backend="native" or "onednn")`` takes (``x`` flattened to
rows); a bias is checked by :func:`_checked_bias`."""


def _checked_bias(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor | None:
    """Check a call whose shapes are not the plain ``[..., k] x [n, k] + [n]``: raise
    :class:`~hwplug.kernels.checks.KernelArgumentError` naming what torch would refuse;
    return a bias to add afterwards where it broadcasts as torch's does (None: no bias,
    or already ``[n]``)."""
    if x.dim() == 0:
        raise KernelArgumentError(
            "linear: x must have at least one dimension ([..., in_features]); got a 0-d tensor"
        )
    LINEAR.check({"x": x.reshape(-1, x.shape[-1]), "weight": weight})
    if bias is None or bias.shape == weight.shape[:1]:
        return None
    result = (*x.shape[:-1], weight.shape[0])
    try:
        shape = torch.broadcast_shapes(bias.shape, result)
    except RuntimeError:
        shape = None
    if shape != torch.Size(result):
        raise KernelArgumentError(
            f"linear: bias of shape {list(bias.shape)} does not broadcast to the result's "
            f"shape {list(result)}: give it [{weight.shape[0]}] (out_features), or a shape "
            "that broadcasts"
        )
    return bias


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    backend: str = "torch",
) -> torch.Tensor:
    """``x @ weight.T + bias`` over ``x``'s last dimension, on ``backend``'s GEMM.

    :param x: ``[..., in_features]``.
    :param weight: ``[out_features, in_features]``, any strides.
    :param bias: ``[out_features]`` or None.
    :param backend: one of :data:`LINEAR_BACKENDS` (usually ``platform.linear_backend``).
    :raises ValueError: an unknown backend; on ``"native"`` and ``"onednn"``, shapes
        that do not multiply, or a bias that does not broadcast to the result
        (:class:`~hwplug.kernels.checks.KernelArgumentError`, also a ``RuntimeError`` as
        torch's own error is, naming both shapes).
    """
    if backend == "torch":
        return torch.nn.functional.linear(x, weight, bias)
    if backend not in ("native", "onednn"):
        raise ValueError(f"unknown linear backend {backend!r}; known: {', '.join(LINEAR_BACKENDS)}")
    if not _runs_cpu(x, weight, bias, backend):
        return torch.nn.functional.linear(x, weight, bias)
    if (
        x.dim() == 0
        or x.shape[-1] != weight.shape[1]
        or (bias is not None and bias.shape != weight.shape[:1])
    ):
        # what the kernels do not take as it is: refused with the argument named, or a
        # bias that broadcasts as torch's does
        broadcast = _checked_bias(x, weight, bias)
        if broadcast is not None:
            return linear(x, weight, None, backend=backend) + broadcast
    rows = x.reshape(-1, x.shape[-1])
    native = backend == "native" and weight.stride(1) == 1
    if torch.compiler.is_compiling():
        op = torch.ops.hwplug.native_linear if native else torch.ops.hwplug.onednn_linear
        out = op(rows, weight, bias)
    else:
        out = _native(rows, weight, bias) if native else _onednn(rows, weight, bias)
    return out.view(*x.shape[:-1], weight.shape[0])
