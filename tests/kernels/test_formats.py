"""The fp8 format table agrees with torch's own description of each format."""

from __future__ import annotations

import pytest
import torch

from hwplug.kernels import FP8_FORMATS, fp8_format, fp8_max, is_fp8


@pytest.mark.parametrize("dtype", list(FP8_FORMATS))
def test_format_constants_match_torch_finfo(dtype: torch.dtype) -> None:
    fmt = FP8_FORMATS[dtype]
    info = torch.finfo(dtype)
    assert fmt.max_finite == info.max
    assert 2.0**fmt.min_normal_exponent == info.smallest_normal
    smallest = torch.tensor([1], dtype=torch.uint8).view(dtype).item()
    assert fmt.subnormal_step == smallest
    nan = torch.tensor([fmt.nan_code], dtype=torch.uint8).view(dtype).float()
    assert nan.isnan().all()


@pytest.mark.parametrize(
    ("dtype", "expected"),
    [
        (torch.float8_e4m3fn, 448.0),
        (torch.float8_e4m3fnuz, 240.0),
        (torch.float8_e5m2, 57344.0),
        (torch.float8_e5m2fnuz, 57344.0),
    ],
)
def test_fp8_max(dtype: torch.dtype, expected: float) -> None:
    assert fp8_max(dtype) == expected


def test_fp8_format_rejects_non_fp8_dtypes() -> None:
    assert not is_fp8(torch.bfloat16)
    with pytest.raises(ValueError, match=r"fp8_dtype must be one of float8_e4m3fn.*bfloat16"):
        fp8_format(torch.bfloat16)
