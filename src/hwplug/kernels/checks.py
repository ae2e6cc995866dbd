"""What each native kernel takes, stated once, and the checks that hold every call to it.

No pointer crosses into C (:mod:`hwplug.kernels.bindings`) before its
tensor has passed the rules of its entry here. An :class:`Entry` lists its
tensor arguments as :class:`TensorRule` values: their named dimensions (one
name is one size across every argument that has it), their dtypes, which of
them the kernel writes (an output shares no memory with any input, and no
two of its own elements share one). Layout is not a rule: the marshalling
layer passes strides or copies, so any strides torch takes are computed
correctly. Scalars have :func:`integer` and :func:`real`.

A bad argument is a :class:`KernelArgumentError` (a ``ValueError``) that
names the entry, the argument, what it got and what is allowed; a value of
the wrong type is a :class:`KernelTypeError` (a ``TypeError`` too). The
checks read shapes, strides, dtypes and devices only, never a tensor's
values: the indices a kernel reads from a tensor (block ids, lengths,
slots) are bounded in C, against the buffers they address, where they are
read.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

import torch

__all__ = [
    "Entry",
    "KernelArgumentError",
    "KernelTypeError",
    "TensorRule",
    "dtype_names",
    "integer",
    "real",
    "shares_memory",
]


class KernelArgumentError(ValueError, RuntimeError):
    """An argument a native kernel does not take: what it was, where, and what is allowed.

    A ``ValueError``; also a ``RuntimeError``, as torch's own shape errors are, so that
    code written against ``torch.nn.functional.linear`` keeps catching it.
    """


class KernelTypeError(TypeError, KernelArgumentError):
    """An argument of the wrong type (not a tensor, a float where an int is taken): a
    ``TypeError``, and a :class:`KernelArgumentError` (so a ``ValueError``) as the
    kernels' documented errors for bad arguments are."""


DtypeRule = frozenset[torch.dtype] | Literal["float", "integer"]


@dataclass(frozen=True, slots=True)
class TensorRule:
    """One tensor argument of a kernel entry.

    :param name: the argument's name, as the caller spells it.
    :param dims: a name for each dimension; a name used by several arguments (or twice in
        one) is one size, bound by the first argument that has it.
    :param dtypes: the dtypes allowed: a set, ``"float"`` (any floating-point dtype) or
        ``"integer"`` (signed or unsigned integers, not bool).
    :param written: the kernel writes it: it may share no memory with another argument,
        and none of its elements may alias another (a dimension of stride 0).
    :param optional: None is allowed (the argument is then skipped).
    :param same_dtype_as: another argument whose dtype this one must have.
    """

    name: str
    dims: tuple[str, ...]
    dtypes: DtypeRule
    written: bool = False
    optional: bool = False
    same_dtype_as: str | None = None


@dataclass(frozen=True)
class Entry:
    """A native kernel's entry point and the rules of its tensor arguments.

    :meth:`check` runs on every call of a hot path (a decode step checks once per
    layer), so it is written for speed: each rule's dtypes are a set looked up once,
    and memory is compared as spans of addresses, the exact test run only where two
    spans meet.
    """

    name: str
    tensors: tuple[TensorRule, ...]

    def __post_init__(self) -> None:
        # each rule as a plain tuple, in order: attribute lookups cost on a hot path
        plan = tuple(
            (
                rule,
                rule.name,
                rule.dims,
                len(rule.dims),
                _allowed_set(rule.dtypes),
                None
                if rule.same_dtype_as is None
                else [r.name for r in self.tensors].index(rule.same_dtype_as),
            )
            for rule in self.tensors
        )
        object.__setattr__(self, "_plan", plan)
        object.__setattr__(self, "_writes", any(rule.written for rule in self.tensors))

    def check(self, given: Mapping[str, object]) -> dict[str, int]:
        """Check ``given`` (argument name to value) against the rules, in their order, and
        return the size of each named dimension.

        :raises KernelTypeError: an argument that is not a tensor (or None where allowed).
        :raises KernelArgumentError: a rank, size, dtype, device or aliasing rule broken.
        """
        return self.check_values(tuple(given.get(rule.name) for rule in self.tensors))

    def check_values(self, values: tuple[object, ...]) -> dict[str, int]:
        """:meth:`check` with the arguments' values in the rules' order (the hot paths'
        call: no mapping built)."""
        sizes: dict[str, int] = {}
        spans: list[tuple[int, int, TensorRule, torch.Tensor]] = []
        writes: bool = self._writes  # type: ignore[attr-defined]
        strided = torch.strided
        for (rule, name, dims, rank, allowed, same_as), tensor in zip(
            self._plan,  # type: ignore[attr-defined]
            values,
        ):
            if tensor is None:
                if rule.optional:
                    continue
                raise KernelTypeError(f"{self.name}: {name} is required (a torch.Tensor); got None")
            if not isinstance(tensor, torch.Tensor):
                raise KernelTypeError(
                    f"{self.name}: {name} must be a torch.Tensor; got {type(tensor).__name__}"
                )
            shape = tensor.shape
            if len(shape) != rank:
                raise KernelArgumentError(
                    f"{self.name}: {name} must be [{', '.join(dims)}] ({rank} dimensions); got "
                    f"shape {list(shape)}"
                )
            for dim, size in zip(dims, shape):
                if sizes.setdefault(dim, size) != size:
                    self._size_error(rule, tensor, dim, sizes[dim], values)
            dtype = tensor.dtype
            if dtype not in allowed:
                raise KernelArgumentError(
                    f"{self.name}: {name} must be {_describe(rule.dtypes)}; got "
                    f"{dtype_names([dtype])}"
                )
            if same_as is not None:
                other = values[same_as]
                if isinstance(other, torch.Tensor) and other.dtype != dtype:
                    raise KernelArgumentError(
                        f"{self.name}: {name} must have {rule.same_dtype_as}'s dtype "
                        f"({dtype_names([other.dtype])}); got {dtype_names([dtype])}"
                    )
            if not tensor.is_cpu:
                raise KernelArgumentError(
                    f"{self.name}: {name} is on {tensor.device}; the native kernels take CPU "
                    "tensors only"
                )
            if tensor.layout is not strided:
                raise KernelArgumentError(
                    f"{self.name}: {name} must be a dense (strided) tensor; got {tensor.layout}"
                )
            if writes:
                count = tensor.numel()
                if count == 0:
                    continue
                start = tensor.data_ptr()
                if tensor.is_contiguous():
                    spans.append((start, start + count * tensor.element_size(), rule, tensor))
                else:
                    spans.append((start, self._end(rule, tensor, start), rule, tensor))
        if len(spans) > 1:
            self._check_written(spans)
        return sizes

    def _size_error(
        self,
        rule: TensorRule,
        tensor: torch.Tensor,
        dim: str,
        known: int,
        values: tuple[object, ...],
    ) -> None:
        binder = next(
            r.name for r, value in zip(self.tensors, values) if dim in r.dims and value is not None
        )
        where = "its own" if binder == rule.name else f"{binder}'s"
        raise KernelArgumentError(
            f"{self.name}: {rule.name} has {dim} = {tensor.shape[rule.dims.index(dim)]} "
            f"(shape {list(tensor.shape)}), but {where} {dim} is {known}; they must be equal"
        )

    def _end(self, rule: TensorRule, tensor: torch.Tensor, start: int) -> int:
        """The byte past the last a non-contiguous, non-empty tensor's elements cover; a
        written tensor whose elements alias each other (a dimension of stride 0) is
        refused."""
        extent = 0
        for size, stride in zip(tensor.shape, tensor.stride()):
            if size > 1:
                if stride == 0 and rule.written:
                    raise KernelArgumentError(
                        f"{self.name}: {rule.name} is written, but several of its elements "
                        f"are one memory location (shape {list(tensor.shape)}, strides "
                        f"{list(tensor.stride())}); pass a tensor whose elements are distinct"
                    )
                extent += (size - 1) * stride
        return start + (extent + 1) * tensor.element_size()

    def _check_written(self, spans: list[tuple[int, int, TensorRule, torch.Tensor]]) -> None:
        """No written tensor shares memory with another argument: each written tensor's
        span of addresses against every other's, the exact test only where two meet."""
        for i, (low, high, rule, tensor) in enumerate(spans):
            if not rule.written:
                continue
            for j, (other_low, other_high, other_rule, other) in enumerate(spans):
                if i == j or other_low >= high or low >= other_high:
                    continue
                if shares_memory(tensor, other):
                    raise KernelArgumentError(
                        f"{self.name}: {rule.name} shares memory with {other_rule.name}; the "
                        f"kernel writes {rule.name} while it reads {other_rule.name}: pass a "
                        "separate tensor"
                    )


_ALL_DTYPES = frozenset(value for value in vars(torch).values() if isinstance(value, torch.dtype))


def _allowed_set(allowed: DtypeRule) -> frozenset[torch.dtype]:
    """The dtypes a rule allows, as a set."""
    if allowed == "float":
        return frozenset(d for d in _ALL_DTYPES if d.is_floating_point)
    if allowed == "integer":
        return frozenset(
            d
            for d in _ALL_DTYPES
            if not d.is_floating_point and not d.is_complex and d != torch.bool
        )
    return frozenset(allowed)


def _describe(allowed: DtypeRule) -> str:
    if allowed == "float":
        return "a floating-point tensor"
    if allowed == "integer":
        return "an integer tensor (not bool)"
    return f"one of {dtype_names(allowed)}"


def dtype_names(dtypes: Iterable[torch.dtype]) -> str:
    """Dtypes as users spell them (``float32, bfloat16``), sorted."""
    return ", ".join(sorted(str(d).removeprefix("torch.") for d in dtypes))


def shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` have an element in common in memory (reads no values).

    Exact for two views with the same strides (interleaved views such as
    ``combined[:, 0]`` and ``combined[:, 1]`` do not share memory); views with
    different strides count as sharing whenever their address ranges meet.
    """
    if a.numel() == 0 or b.numel() == 0 or a.device != b.device:
        return False
    if a.device.type == "meta":  # no memory at all: nothing to share
        return a is b
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False
    size = a.element_size()

    def span(t: torch.Tensor) -> tuple[int, int]:
        start = t.data_ptr()
        extent = sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride(), strict=True))
        return start, start + (extent + 1) * t.element_size()

    a0, a1 = span(a)
    b0, b1 = span(b)
    if not (a0 < b1 and b0 < a1):
        return False
    if a.stride() != b.stride() or a.shape != b.shape or b.element_size() != size:
        return True
    delta, rem = divmod(b.data_ptr() - a.data_ptr(), size)
    if rem:
        return True  # misaligned views of one buffer: be conservative
    dims = sorted(
        ((abs(st), n - 1) for n, st in zip(a.shape, a.stride(), strict=True) if n > 1 and st != 0),
        reverse=True,
    )
    return _offset_reachable(delta, dims)


def _offset_reachable(delta: int, dims: list[tuple[int, int]]) -> bool:
    """Whether ``delta`` = sum of ``c * stride`` with ``|c| <= reach`` over ``(stride, reach)``."""
    if not dims:
        return delta == 0
    (stride, reach), rest = dims[0], dims[1:]
    below = sum(st * r for st, r in rest)  # what the smaller strides can still make up
    low = max(-reach, -((below - delta) // stride))  # ceil((delta - below) / stride)
    high = min(reach, (delta + below) // stride)
    # nested strides (any view of a dense tensor) leave at most a few candidates
    return any(_offset_reachable(delta - c * stride, rest) for c in range(low, high + 1))


def integer(entry: str, name: str, value: object, *, low: int, high: int | None = None) -> int:
    """``value`` as an int in ``low..high`` (any integral number, not bool or float).

    :raises TypeError: not an integer.
    :raises KernelArgumentError: outside the range.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise KernelTypeError(
            f"{entry}: {name} must be an integer; got {value!r} ({type(value).__name__})"
        )
    number = int(value)
    if number < low or (high is not None and number > high):
        allowed = f">= {low}" if high is None else f"in {low}..{high}"
        raise KernelArgumentError(f"{entry}: {name} must be {allowed}; got {number}")
    return number


def real(entry: str, name: str, value: object) -> float:
    """``value`` as a finite float (any real number, not bool).

    :raises TypeError: not a real number.
    :raises KernelArgumentError: NaN or infinite.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise KernelTypeError(
            f"{entry}: {name} must be a real number; got {value!r} ({type(value).__name__})"
        )
    number = float(value)
    if not math.isfinite(number):
        raise KernelArgumentError(f"{entry}: {name} must be finite; got {number}")
    return number
