"""The number formats a KV cache can be stored in, described as data.

Each fp8 format is fully described by its mantissa width, exponent bias and
how it spends its special codes; the kernels derive every constant they need
(largest finite value, subnormal spacing, NaN code) from that description, so
both backends agree on exactly one definition of each format.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import torch

__all__ = [
    "CACHE_DTYPES",
    "FP8_FORMATS",
    "INPUT_DTYPES",
    "Fp8Format",
    "fp8_format",
    "fp8_max",
    "is_fp8",
]

Flavor = Literal["fn", "ieee", "fnuz"]


@dataclasses.dataclass(frozen=True)
class Fp8Format:
    """One 8-bit floating-point format.

    ``flavor`` says how the special codes are used: ``"fn"`` (OCP e4m3: no
    infinities, ``S.1111.111`` is NaN), ``"ieee"`` (OCP e5m2: an all-ones
    exponent holds infinities and NaNs) or ``"fnuz"`` (AMD: no infinities, no
    negative zero, ``0x80`` is the only NaN).
    """

    dtype: torch.dtype
    mantissa_bits: int
    exponent_bias: int
    flavor: Flavor

    @property
    def name(self) -> str:
        """The torch dtype name, e.g. ``"float8_e4m3fn"``."""
        return str(self.dtype).removeprefix("torch.")

    @property
    def exponent_bits(self) -> int:
        return 7 - self.mantissa_bits

    @property
    def min_normal_exponent(self) -> int:
        """Exponent of the smallest normal number (``-6`` for e4m3fn)."""
        return 1 - self.exponent_bias

    @property
    def subnormal_step(self) -> float:
        """Spacing of the subnormal numbers (the smallest positive value)."""
        return 2.0 ** (self.min_normal_exponent - self.mantissa_bits)

    @property
    def max_finite(self) -> float:
        """The largest finite value (448 for e4m3fn, 240 for e4m3fnuz, 57344 for e5m2)."""
        top_exponent = (1 << self.exponent_bits) - 1
        top_mantissa = (1 << self.mantissa_bits) - 1
        if self.flavor == "fn":
            # the all-ones code is NaN, so the top exponent loses its last mantissa value
            top_mantissa -= 1
        elif self.flavor == "ieee":
            # the all-ones exponent is reserved for infinities and NaNs
            top_exponent -= 1
        significand = 1.0 + top_mantissa / (1 << self.mantissa_bits)
        return float(significand * 2.0 ** (top_exponent - self.exponent_bias))

    @property
    def nan_code(self) -> int:
        """The positive NaN code (``0x80`` for fnuz formats, which have one NaN)."""
        return 0x80 if self.flavor == "fnuz" else 0x7F


FP8_FORMATS: dict[torch.dtype, Fp8Format] = {
    f.dtype: f
    for f in (
        Fp8Format(torch.float8_e4m3fn, mantissa_bits=3, exponent_bias=7, flavor="fn"),
        Fp8Format(torch.float8_e4m3fnuz, mantissa_bits=3, exponent_bias=8, flavor="fnuz"),
        Fp8Format(torch.float8_e5m2, mantissa_bits=2, exponent_bias=15, flavor="ieee"),
        Fp8Format(torch.float8_e5m2fnuz, mantissa_bits=2, exponent_bias=16, flavor="fnuz"),
    )
}
"""The fp8 formats the kernels can store, by torch dtype."""

INPUT_DTYPES: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float16, torch.float32)
"""dtypes of keys and values, and of what ``gather_kv_cache`` returns."""

CACHE_DTYPES: tuple[torch.dtype, ...] = (*FP8_FORMATS, *INPUT_DTYPES)
"""dtypes a KV cache tensor may have."""


def is_fp8(dtype: torch.dtype) -> bool:
    """Whether ``dtype`` is one of the fp8 formats in :data:`FP8_FORMATS`."""
    return dtype in FP8_FORMATS


def fp8_format(dtype: torch.dtype) -> Fp8Format:
    """The description of fp8 ``dtype``; ``ValueError`` for anything else."""
    try:
        return FP8_FORMATS[dtype]
    except (KeyError, TypeError):
        allowed = ", ".join(f.name for f in FP8_FORMATS.values())
        raise ValueError(f"fp8_dtype must be one of {allowed}; got {dtype!r}") from None


def fp8_max(dtype: torch.dtype) -> float:
    """The largest finite value of fp8 ``dtype`` (448.0 for ``float8_e4m3fn``)."""
    return fp8_format(dtype).max_finite
