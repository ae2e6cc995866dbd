"""Linear layers whose weights are prepacked for oneDNN, the CPU's fast GEMM.

On CPUs, ``torch.nn.functional.linear`` in float32 runs the BLAS library's
``sgemm``, which repacks the weight on every call; oneDNN can pack a weight
once into the blocked layout its kernels stream, and then multiplies by it
much faster, most of all for the few-row products of decoding (on the
2-core AMD EPYC machines of our CI: 2.0-2.3x in float32 and 1.8-2.1x in
bfloat16 for 1-16 rows, 1.1x for 512; ``benchmarks/bench_linear.py``).
Inductor does this only when it freezes the model, which also bakes every
buffer into the graph, fp8 KV scales included.

:func:`pack_linears` swaps a model's ``nn.Linear`` layers (those of at least
:data:`MIN_PACKED_BYTES`) for :class:`PackedLinear` after its weights are
loaded. A packed layer keeps its dense ``weight`` (the state dict does not
change) and runs the ``hwplug::packed_linear`` custom op, opaque to
``torch.compile``, so compiled graphs call oneDNN too. It falls back to
``torch.nn.functional.linear`` wherever packing does not apply: weights off
the CPU, dtypes oneDNN cannot pack on this CPU (float16 without
AVX512-FP16), a torch built without oneDNN, and autograd. A weight changed
in place is repacked at its next use. The packed copy is kept beside the
dense weight, so packed layers take twice their weights' memory.

Results equal ``torch.nn.functional.linear``'s up to float rounding (the sum
runs in another order: about 1e-6 relative in float32).
"""

from __future__ import annotations

import functools
import itertools
import threading
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["MIN_PACKED_BYTES", "PackedLinear", "pack_linears", "packing_unavailable_reason"]

PACKABLE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
"""The weight dtypes oneDNN packs (float16 and bfloat16 only where the CPU has the instructions)."""


@dataclass
class _Packed:
    """One layer's packed weight and what it was packed from."""

    packed: torch.Tensor
    data_ptr: int
    version: int | None


_registry: dict[int, _Packed] = {}
_handles = itertools.count(1)
_lock = threading.Lock()


def _version(weight: torch.Tensor) -> int | None:
    # Inference tensors keep no version counter: they are only compared by address.
    return None if weight.is_inference() else int(weight._version)


def _pack(weight: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        packed: torch.Tensor = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)
    return packed


@functools.cache
def _kernel_problem(dtype: torch.dtype) -> str | None:
    """Whether oneDNN packs and multiplies ``dtype`` on this CPU, tried once on a tiny
    product: the 16-bit paths need CPU instructions, and some builds (other CPU
    architectures) lack a kernel, which torch reports only on first use."""
    name = str(dtype).removeprefix("torch.")
    try:
        packed = _pack(torch.ones(2, 2, dtype=dtype))
        out = torch.ops.mkldnn._linear_pointwise(
            torch.ones(1, 2, dtype=dtype), packed, None, "none", [], ""
        )
    except (RuntimeError, NotImplementedError) as exc:
        return f"oneDNN cannot pack {name} weights here: {str(exc).splitlines()[0]}"
    if out.tolist() != [[2.0, 2.0]]:
        return f"oneDNN's packed {name} product gave a wrong result on this CPU"
    return None


def packing_unavailable_reason(weight: torch.Tensor) -> str | None:
    """Why ``weight`` cannot be packed for oneDNN here, or None when it can.

    Packing needs a 2-d CPU weight in float32, bfloat16 or float16 (the 16-bit
    ones where this CPU has the instructions) and a torch built with oneDNN.
    """
    if not isinstance(weight, torch.Tensor):
        return f"a linear weight must be a torch.Tensor, got {type(weight).__name__}"
    if weight.dim() != 2:
        return f"a linear weight is 2-d [out_features, in_features]; got shape {list(weight.shape)}"
    if weight.device.type != "cpu":
        return f"the weight is on {weight.device}; oneDNN packing is for CPU weights"
    if weight.dtype not in PACKABLE_DTYPES:
        return f"oneDNN does not pack {str(weight.dtype).removeprefix('torch.')} weights"
    if not (
        torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    ):
        return "this torch build has no oneDNN (mkldnn) linear kernels"
    return _kernel_problem(weight.dtype)
    return None


def _register_op() -> Callable[..., torch.Tensor]:
    """Register ``hwplug::packed_linear`` (once) and return it."""

    @torch.library.custom_op("hwplug::packed_linear", mutates_args=())
    def packed_linear(
        x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, handle: int
    ) -> torch.Tensor:
        """``x @ weight.T + bias`` with the weight packed under ``handle``."""
        entry = _registry.get(handle)
        if entry is None or x.device.type != "cpu" or x.dtype != weight.dtype:
            return torch.nn.functional.linear(x, weight, bias)
        if entry.data_ptr != weight.data_ptr() or entry.version != _version(weight):
            # changed in place, reloaded or converted since packing
            if packing_unavailable_reason(weight) is not None:
                _registry.pop(handle, None)  # e.g. converted to float64: dense from now on
                return torch.nn.functional.linear(x, weight, bias)
            entry.packed = _pack(weight)
            entry.data_ptr, entry.version = weight.data_ptr(), _version(weight)
        out_features = weight.shape[0]
        rows = x.reshape(-1, x.shape[-1])
        if rows.shape[0] == 0:
            return x.new_empty((*x.shape[:-1], out_features))
        out = torch.ops.mkldnn._linear_pointwise(
            rows.contiguous(), entry.packed, bias, "none", [], ""
        )
        return out.reshape(*x.shape[:-1], out_features)

    @packed_linear.register_fake
    def _(
        x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, handle: int
    ) -> torch.Tensor:
        return x.new_empty((*x.shape[:-1], weight.shape[0]))

    op: Callable[..., torch.Tensor] = torch.ops.hwplug.packed_linear
    return op


_op: Callable[..., torch.Tensor] | None = None


def _packed_linear_op() -> Callable[..., torch.Tensor]:
    global _op
    with _lock:
        if _op is None:
            _op = _register_op()
    return _op


class PackedLinear(torch.nn.Module):
    """An ``nn.Linear`` whose weight is also kept packed for oneDNN (see the module doc).

    Build it with :meth:`from_linear` once the weights are final; it shares
    the layer's ``weight`` and ``bias`` parameters.

    :raises ValueError: the weight cannot be packed (the message says why).
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        reason = packing_unavailable_reason(weight)
        if reason is not None:
            raise ValueError(f"PackedLinear: {reason}")
        if bias is not None and (bias.shape != weight.shape[:1] or bias.dtype != weight.dtype):
            raise ValueError(
                f"PackedLinear: bias must be [{weight.shape[0]}] in "
                f"{str(weight.dtype).removeprefix('torch.')}; got {list(bias.shape)} in "
                f"{str(bias.dtype).removeprefix('torch.')}"
            )
        self.weight = weight
        self.bias = bias
        self.in_features = int(weight.shape[1])
        self.out_features = int(weight.shape[0])
        _packed_linear_op()
        self.handle = 0
        """The key of this layer's packed weight in the op's registry (a graph constant)."""
        self._register()

    def _register(self) -> None:
        """Pack the weight under a new handle (none when it cannot be packed here)."""
        self.handle = next(_handles)
        weight = self.weight
        if packing_unavailable_reason(weight) is None:
            _registry[self.handle] = _Packed(_pack(weight), weight.data_ptr(), _version(weight))
            weakref.finalize(self, _registry.pop, self.handle, None)

    def __setstate__(self, state: dict[str, Any]) -> None:
        # An unpickled or deep-copied layer packs its own weight under its own handle
        # (one loaded onto another device runs torch.nn.functional.linear).
        super().__setstate__(state)
        _packed_linear_op()
        self._register()

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear) -> PackedLinear:
        """A packed layer sharing ``linear``'s parameters."""
        return cls(linear.weight, linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        needs_grad = x.requires_grad or self.weight.requires_grad
        if needs_grad and torch.is_grad_enabled():
            return torch.nn.functional.linear(x, self.weight, self.bias)
        op = _op if _op is not None else _packed_linear_op()
        return op(x, self.weight, self.bias, self.handle)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, packed=oneDNN"
        )


MIN_PACKED_BYTES = 1 << 20
"""The smallest weight :func:`pack_linears` packs by default. Each packed call costs
some 20 microseconds more than ``nn.Linear``'s, which smaller products do not win back."""


def pack_linears(module: torch.nn.Module, *, min_bytes: int = MIN_PACKED_BYTES) -> list[str]:
    """Swap every ``nn.Linear`` inside ``module`` whose weight can be packed and holds at
    least ``min_bytes`` for a :class:`PackedLinear`; returns the swapped layers' names.

    Call it once the weights are loaded (and tied). Layers that cannot be
    packed (weights off the CPU, unsupported dtypes) stay as they are, so on
    other devices it changes nothing and returns ``[]``.

    :raises TypeError: ``module`` is not a ``torch.nn.Module``.
    :raises ValueError: ``min_bytes`` is not a non-negative integer.
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"pack_linears needs a torch.nn.Module, got {type(module).__name__}")
    if isinstance(min_bytes, bool) or not isinstance(min_bytes, int) or min_bytes < 0:
        raise ValueError(f"min_bytes must be a non-negative integer, got {min_bytes!r}")
    swapped: list[str] = []
    for parent_name, parent in list(module.named_modules()):
        for name, child in list(parent.named_children()):
            if type(child) is not torch.nn.Linear:
                continue
            weight = child.weight
            if weight.numel() * weight.element_size() < min_bytes:
                continue
            if packing_unavailable_reason(weight) is not None:
                continue
            setattr(parent, name, PackedLinear.from_linear(child))
            swapped.append(f"{parent_name}.{name}" if parent_name else name)
    return swapped
