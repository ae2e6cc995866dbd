"""Shared helpers for the kernel tests: byte comparison and an independent rounding oracle."""

from __future__ import annotations

import torch

from hwplug.kernels import FP8_FORMATS

_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32}


def ordinal(t: torch.Tensor) -> torch.Tensor:
    """Map each element's bit pattern to its position on the number line.

    Adjacent representable values get adjacent ordinals (+0 and -0 both map to
    0), so ``|ordinal(a) - ordinal(b)|`` counts rounding steps.
    """
    bits = t.view(_INT_VIEW[t.element_size()]).to(torch.int64)
    width = 8 * t.element_size()
    bits = bits & ((1 << width) - 1)
    sign = bits >> (width - 1)
    mag = bits & ((1 << (width - 1)) - 1)
    return torch.where(sign == 1, -mag, mag)


def assert_same_bytes(got: torch.Tensor, want: torch.Tensor, min_equal: float = 0.999) -> None:
    """At least ``min_equal`` of the elements are bitwise equal, the rest one step apart.

    Elements that are NaN in both count as equal.
    """
    assert got.shape == want.shape
    assert got.dtype == want.dtype
    if got.numel() == 0:
        return
    view = _INT_VIEW[got.element_size()]
    both_nan = got.float().isnan() & want.float().isnan()
    equal = (got.view(view) == want.view(view)) | both_nan
    fraction = equal.float().mean().item()
    assert fraction >= min_equal, f"only {fraction:.4%} of the elements are bitwise equal"
    steps = (ordinal(got) - ordinal(want)).abs()
    worst = int(steps[~equal].max().item()) if (~equal).any() else 0
    assert worst <= 1, f"elements differ by up to {worst} rounding steps"


def nearest_even_oracle(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Quantise fp32 ``x`` to fp8 ``dtype`` without using torch's fp8 cast.

    Enumerates every finite code, saturates, then picks the nearest value and,
    on a tie, the code with the even mantissa. Written independently of both
    backends so that it can judge them.
    """
    fmt = FP8_FORMATS[dtype]
    codes = torch.arange(256, dtype=torch.uint8)
    values = codes.view(dtype).to(torch.float64)
    finite = values.isfinite()
    if fmt.flavor != "fnuz":
        finite &= codes != 0x80  # keep a single zero: +0
    codes, values = codes[finite], values[finite]
    order = values.argsort()
    codes, values = codes[order], values[order]
    flat = x.to(torch.float64).reshape(-1).clamp(-fmt.max_finite, fmt.max_finite)
    hi = torch.searchsorted(values, flat).clamp(1, len(values) - 1)
    lo = hi - 1
    d_lo = (flat - values[lo]).abs()
    d_hi = (values[hi] - flat).abs()
    even_hi = (codes[hi].to(torch.int64) & 1) == 0
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & even_hi)
    chosen = torch.where(pick_hi, codes[hi], codes[lo])
    result = chosen.view(dtype).reshape(x.shape).clone()
    # a value that rounds to zero keeps its sign where the format has -0
    if fmt.flavor != "fnuz":
        zero = result.to(torch.float32) == 0
        neg = torch.signbit(x.reshape(result.shape))
        result.view(torch.uint8)[zero & neg] = 0x80
    return result


def edge_values(dtype: torch.dtype) -> torch.Tensor:
    """Every finite fp8 value, the midpoints between neighbours (ties), their fp32
    neighbours, and out-of-range, infinite and signed-zero inputs."""
    values = torch.arange(256, dtype=torch.uint8).view(dtype).to(torch.float32)
    values = values[values.isfinite()].unique()
    mids = (values[1:] + values[:-1]) / 2
    up, down = torch.tensor(float("inf")), torch.tensor(float("-inf"))
    fmt = FP8_FORMATS[dtype]
    specials = [float("inf"), float("-inf"), 1e30, -1e30, 3.4e38, 0.0, -0.0, 1e-40, -1e-40]
    extremes = torch.tensor(
        [*specials, fmt.max_finite * 1.03, -fmt.max_finite * 1.03, fmt.subnormal_step / 2]
    )
    return torch.cat(
        [
            values,
            mids,
            values.nextafter(up),
            values.nextafter(down),
            mids.nextafter(up),
            mids.nextafter(down),
            extremes,
        ]
    )
