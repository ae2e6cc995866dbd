"""compute_kv_scales: per-tensor amax over the format's largest finite value."""

from __future__ import annotations

import pytest
import torch

from hwplug.kernels import FP8_FORMATS, compute_kv_scales


@pytest.mark.parametrize(
    ("dtype", "largest"),
    [
        (torch.float8_e4m3fn, 448.0),
        (torch.float8_e4m3fnuz, 240.0),
        (torch.float8_e5m2, 57344.0),
    ],
)
def test_scale_is_amax_over_largest_finite_value(dtype: torch.dtype, largest: float) -> None:
    key = torch.tensor([[[1.0, -8.96]]])
    value = torch.tensor([[[0.5, 2.0]], [[-4.0, 3.0]]])
    k_scale, v_scale = compute_kv_scales(key, value, dtype)
    for scale in (k_scale, v_scale):
        assert scale.dim() == 0
        assert scale.dtype == torch.float32
    assert k_scale.item() == pytest.approx(8.96 / largest, rel=1e-6)
    assert v_scale.item() == pytest.approx(4.0 / largest, rel=1e-6)


def test_all_zero_input_gives_scale_one() -> None:
    zeros = torch.zeros(3, 2, 4, dtype=torch.bfloat16)
    k_scale, v_scale = compute_kv_scales(zeros, torch.ones(3, 2, 4), torch.float8_e4m3fn)
    assert k_scale.item() == 1.0
    assert v_scale.item() == pytest.approx(1.0 / 448.0)
    empty = torch.zeros(0, 2, 4)
    k_empty, _ = compute_kv_scales(empty, empty, torch.float8_e5m2)
    assert k_empty.item() == 1.0


def test_scaled_data_fills_the_format_without_saturating() -> None:
    torch.manual_seed(0)
    key = torch.randn(16, 2, 8) * 1000
    for dtype, fmt in FP8_FORMATS.items():
        k_scale, _ = compute_kv_scales(key, key, dtype)
        assert (key / k_scale).abs().max().item() == pytest.approx(fmt.max_finite, rel=1e-6)


def test_dtype_may_be_given_by_name() -> None:
    ones = torch.ones(1, 1, 1)
    assert compute_kv_scales(ones, ones, "float8_e4m3fnuz")[0].item() == pytest.approx(1 / 240)
    assert compute_kv_scales(ones, ones, "torch.float8_e5m2")[0].item() == pytest.approx(1 / 57344)


def test_errors_name_the_argument() -> None:
    ones = torch.ones(1, 1, 1)
    with pytest.raises(ValueError, match="fp8_dtype must be one of float8_e4m3fn"):
        compute_kv_scales(ones, ones, torch.float16)
    with pytest.raises(ValueError, match="fp8_dtype must be one of"):
        compute_kv_scales(ones, ones, "fp8")
    with pytest.raises(ValueError, match="key must be a floating-point tensor"):
        compute_kv_scales(torch.ones(1, dtype=torch.int32), ones, torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"value must be a torch\.Tensor"):
        compute_kv_scales(ones, [1.0], torch.float8_e4m3fn)
