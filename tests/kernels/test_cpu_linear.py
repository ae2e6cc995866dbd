"""The native CPU linear kernel: the float64 product read from the weight where it lies.

Judged against float64 over generated shapes (rows, features and inputs on and
off its tile edges of 4 x 3 and its 8 lanes), 32- and 16-bit weights, strided
rows, a bias, an output written into a wider buffer; every misuse is a
ValueError before the kernel touches memory. Its build without the CPU
features it needs is exercised in a new process, where it must say why and
leave ``linear(backend="native")`` on oneDNN.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hwplug.kernels import (
    NATIVE_LINEAR_DTYPES,
    NATIVE_LINEAR_MAX_ROWS,
    linear,
    native_linear,
    native_linear_lanes,
    native_linear_rows,
    native_linear_unavailable_reason,
)

pytestmark = pytest.mark.skipif(
    native_linear_unavailable_reason() is not None,
    reason=f"the native linear kernel cannot run here: {native_linear_unavailable_reason()}",
)


def _reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """float64 product of the values the kernel reads (16-bit weights exactly widened)."""
    return torch.nn.functional.linear(x.double(), w.double(), None if b is None else b.double())


def _assert_close(got: torch.Tensor, want: torch.Tensor, k: int) -> None:
    """float32 sums of ``k`` products: error grows with k and the size of the terms."""
    assert got.dtype == torch.float32 and got.shape == want.shape
    if want.numel() == 0:
        return
    tolerance = 1e-5 * max(1.0, math.sqrt(k)) * max(1.0, float(want.abs().max()))
    assert float((got.double() - want).abs().max()) <= tolerance


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(0, 40),  # several passes of the widest tile, and part of one
    k=st.integers(0, 70),
    n=st.integers(0, 40),
    dtype=st.sampled_from(sorted(NATIVE_LINEAR_DTYPES, key=str)),
    bias=st.booleans(),
    strided=st.booleans(),
    threads=st.sampled_from([1, 2, 3]),
    seed=st.integers(0, 2**16),
)
def test_it_gives_the_float64_product_over_generated_shapes(
    rows: int,
    k: int,
    n: int,
    dtype: torch.dtype,
    bias: bool,
    strided: bool,
    threads: int,
    seed: int,
) -> None:
    gen = torch.Generator().manual_seed(seed)
    if strided:  # rows of wider matrices: the kernel must honour the row strides
        x = torch.randn(rows, k + 5, generator=gen)[:, 2 : 2 + k]
        w = torch.randn(n, k + 3, generator=gen).to(dtype)[:, 1 : 1 + k]
        wide = torch.full((rows, n + 4), float("nan"))
        out: torch.Tensor | None = wide[:, 3 : 3 + n]
    else:
        x = torch.randn(rows, k, generator=gen)
        w = torch.randn(n, k, generator=gen).to(dtype)
        out = None
    b = torch.randn(n, generator=gen) if bias else None
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = native_linear(x, w, b, out=out)
    finally:
        torch.set_num_threads(previous)
    _assert_close(got, _reference(x, w, b), k)
    if out is not None:
        assert got.data_ptr() == out.data_ptr()
        assert torch.isnan(wide[:, :3]).all() and torch.isnan(wide[:, 3 + n :]).all()


@settings(max_examples=80, deadline=None)
@given(
    k=st.integers(0, 160),  # whole and part steps of two vectors of k, and a scalar tail
    n=st.integers(0, 40),  # whole six-row tiles of the one-row path, and the rest
    bias=st.booleans(),
    strided=st.booleans(),
    threads=st.sampled_from([1, 2, 3]),
    seed=st.integers(0, 2**16),
)
def test_one_float32_row_gives_the_float64_product(
    k: int, n: int, bias: bool, strided: bool, threads: int, seed: int
) -> None:
    """One row of a float32 step: the one-row tiles and, past them, the tile path."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(1, k + 5, generator=gen)[:, 2 : 2 + k] if strided else torch.randn(1, k)
    w = torch.randn(n, k + 3, generator=gen)[:, 1 : 1 + k] if strided else torch.randn(n, k)
    b = torch.randn(n, generator=gen) if bias else None
    wide = torch.full((1, n + 4), float("nan"))
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = native_linear(x, w, b, out=wide[:, 3 : 3 + n])
    finally:
        torch.set_num_threads(previous)
    _assert_close(got, _reference(x, w, b), k)
    assert torch.isnan(wide[:, :3]).all() and torch.isnan(wide[:, 3 + n :]).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_16_bit_inputs_are_computed_in_float32(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(5, 33, generator=gen).to(dtype)
    w = torch.randn(7, 33, generator=gen).to(dtype)
    _assert_close(native_linear(x, w), _reference(x, w, None), 33)


def test_special_values_propagate_as_ieee_products_do() -> None:
    x = torch.ones(6, 16)
    w = torch.ones(5, 16)
    x[1, 3] = float("nan")
    w[2, 9] = float("inf")
    got = native_linear(x, w)
    assert torch.isnan(got[1]).all()
    assert torch.isinf(got[[0, 2, 3, 4, 5], 2]).all()
    finite = got.clone()
    finite[1] = 0
    finite[:, 2] = 0
    assert torch.isfinite(finite).all()


def test_the_float16_weights_are_decoded_exactly_subnormals_included() -> None:
    codes = torch.arange(0, 0x7C00, 7, dtype=torch.int32).to(torch.int16)  # finite, >= 0
    w = codes.view(torch.float16)[: (codes.numel() // 24) * 24].reshape(-1, 24)
    eye = torch.eye(24)
    assert torch.equal(native_linear(eye, w), w.float().t())
    wb = w.float().bfloat16()
    assert torch.equal(native_linear(eye, wb), wb.float().t())


def test_an_in_place_update_of_the_weight_is_seen_by_the_next_call() -> None:
    x, w = torch.randn(4, 24), torch.randn(9, 24)
    before = native_linear(x, w)
    w.mul_(-2.0)
    assert torch.allclose(native_linear(x, w), -2.0 * before, atol=1e-5)


def test_no_inputs_gives_the_bias_and_no_rows_or_features_gives_empty() -> None:
    b = torch.randn(6)
    assert torch.equal(native_linear(torch.empty(3, 0), torch.empty(6, 0), b), b.expand(3, 6))
    assert torch.equal(native_linear(torch.empty(3, 0), torch.empty(6, 0)), torch.zeros(3, 6))
    assert native_linear(torch.empty(0, 8), torch.randn(6, 8)).shape == (0, 6)
    assert native_linear(torch.randn(2, 8), torch.empty(0, 8)).shape == (2, 0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"x": torch.randn(2, 8), "weight": torch.randn(3, 7)},
            r"weight has in_features = 7 \(shape \[3, 7\]\), but x's in_features is 8",
        ),
        ({"x": torch.randn(8), "weight": torch.randn(3, 8)}, r"x must be \[rows, in_features\]"),
        (
            {"x": torch.randn(2, 8), "weight": torch.randn(3, 8).double()},
            r"weight must be one of bfloat16, float16, float32; got float64",
        ),
        (
            {"x": torch.ones(2, 8, dtype=torch.int32), "weight": torch.randn(3, 8)},
            r"x must be a floating-point tensor; got int32",
        ),
        (
            {"x": torch.randn(2, 8), "weight": torch.randn(3, 8), "bias": torch.randn(4)},
            r"bias has out_features = 4 \(shape \[4\]\), but weight's out_features is 3",
        ),
        (
            {"x": torch.randn(2, 8), "weight": torch.randn(3, 8), "out": torch.empty(3, 2)},
            r"out has rows = 3 \(shape \[3, 2\]\), but x's rows is 2",
        ),
        (
            {"x": torch.randn(2, 8), "weight": torch.randn(3, 8), "out": torch.empty(2, 3).half()},
            r"out must be one of float32; got float16",
        ),
        (
            {
                "x": torch.randn(2, 8),
                "weight": torch.randn(3, 8),
                "out": torch.empty(1, 3).expand(2, 3),
            },
            r"out is written, but several of its elements are one memory location",
        ),
        (
            {"x": torch.randn(2, 8), "weight": torch.randn(3, 8, device="meta")},
            r"weight is on meta; the native kernels take CPU tensors only",
        ),
    ],
)
def test_misuse_is_a_value_error_naming_what_is_allowed(
    kwargs: dict[str, torch.Tensor], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        native_linear(**kwargs)


def test_other_devices_and_the_switch_say_why_it_cannot_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert "CPU tensors, not meta" in str(native_linear_unavailable_reason("meta"))
    monkeypatch.setenv("HWPLUG_NATIVE_KERNELS", "0")
    assert native_linear_unavailable_reason() == "HWPLUG_NATIVE_KERNELS=0 is set"
    with pytest.raises(RuntimeError, match="cannot run: HWPLUG_NATIVE_KERNELS=0 is set"):
        native_linear(torch.randn(2, 8), torch.randn(3, 8))
    x, w = torch.randn(3, 8), torch.randn(5, 8)  # the backend still multiplies (oneDNN)
    assert torch.allclose(linear(x, w, backend="native"), x @ w.t(), atol=1e-5)


@pytest.mark.parametrize("rows", [1, 4, "limit", "limit+1", NATIVE_LINEAR_MAX_ROWS + 1, 150])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_native_backend_gives_the_product_on_both_sides_of_its_row_limit(
    rows: int | str, dtype: torch.dtype
) -> None:
    if isinstance(rows, str):  # this CPU's limit for the dtype (at least 1)
        rows = max(1, native_linear_rows(dtype)) + (1 if rows.endswith("+1") else 0)
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 72, generator=gen).to(dtype)
    w = torch.randn(40, 72, generator=gen).to(dtype)
    b = torch.randn(40, generator=gen).to(dtype)
    got = linear(x, w, b, backend="native")
    want = torch.nn.functional.linear(x.float(), w.float(), b.float())
    assert got.dtype == dtype
    tolerance = 1e-4 if dtype == torch.float32 else 3e-2
    assert float((got.float() - want).abs().max()) <= tolerance * float(want.abs().max())


def test_the_row_limit_follows_the_kernel_and_the_dtype() -> None:
    """The kernel takes no rows of a dtype it cannot read, at most the maximum of any,
    and float32 up to the maximum where it has only AVX2 (oneDNN's GEMM has no more)."""
    assert native_linear_rows(torch.float64) == 0
    assert native_linear_rows(torch.int8) == 0
    for dtype in NATIVE_LINEAR_DTYPES:
        assert 0 < native_linear_rows(dtype) <= NATIVE_LINEAR_MAX_ROWS
    assert native_linear_lanes() in (8, 16)
    if native_linear_lanes() == 8:
        assert native_linear_rows(torch.float32) == NATIVE_LINEAR_MAX_ROWS


_PROBE = """
import logging, torch
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
from hwplug.kernels import linear, native_decode_unavailable_reason
from hwplug.kernels import native_linear_unavailable_reason
print("LINEAR", native_linear_unavailable_reason())
print("DECODE", native_decode_unavailable_reason())
x, w = torch.randn(3, 40), torch.randn(7, 40)
print("CLOSE", torch.allclose(linear(x, w, backend="native"), x @ w.t(), atol=1e-5))
"""


_AVX2_PROBE = """
import torch
from hwplug.kernels import native_linear, native_linear_lanes, native_linear_rows
print("LANES", native_linear_lanes(), "ROWS", native_linear_rows(torch.float32))
gen = torch.Generator().manual_seed(0)
worst = 0.0
for rows, inputs, features in [(1, 8, 3), (3, 40, 7), (5, 100, 11), (16, 136, 9), (64, 72, 5)]:
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        x = torch.randn(rows, inputs, generator=gen)
        w = torch.randn(features, inputs, generator=gen).to(dtype)
        want = x.double() @ w.double().t()
        got = native_linear(x, w).double()
        worst = max(worst, float(((got - want).abs() / (1 + want.abs())).max()))
print("WORST", worst)
from hwplug.kernels import paged_decode_attention
worst = 0.0
for heads, kv_heads, size, lens, block in [(4, 2, 8, [5, 33], 4), (8, 1, 24, [17, 40], 16),
                                          (16, 4, 64, [70, 3], 16), (6, 2, 16, [9], 32),
                                          (12, 2, 64, [30, 47], 16), (8, 2, 128, [40, 21], 16)]:
    for dtype in (torch.float32, torch.bfloat16):
        pages = -(-max(lens) // block)
        k = torch.randn(len(lens) * pages + 2, block, kv_heads, size, generator=gen).to(dtype)
        v = torch.randn(k.shape, generator=gen).to(dtype)
        table = torch.randperm(k.shape[0], generator=gen)[: len(lens) * pages].view(len(lens), -1)
        q = torch.randn(len(lens), heads, size, generator=gen)
        got = paged_decode_attention(q, k, v, table, torch.tensor(lens), scale=size**-0.5)
        for i, n in enumerate(lens):
            rows = torch.tensor([int(table[i, t // block]) * block + t % block for t in range(n)])
            keys = k.flatten(0, 1)[rows].double().repeat_interleave(heads // kv_heads, 1)
            values = v.flatten(0, 1)[rows].double().repeat_interleave(heads // kv_heads, 1)
            weights = torch.einsum("hd,thd->ht", q[i].double(), keys).mul(size**-0.5).softmax(-1)
            want = torch.einsum("ht,thd->hd", weights, values)
            worst = max(worst, float((got[i].double() - want).abs().max()))
print("DECODE_WORST", worst)
"""


def test_built_for_avx2_only_it_multiplies_8_lanes_at_a_time(tmp_path: Path) -> None:
    """The 256-bit path, built on a CPU with AVX-512 by leaving AVX-512 out (where the CPU
    has only AVX2 it is the path every other test takes): the same products, and the
    same decode attention."""
    compiler = os.environ.get("CC", "cc")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path), "CC": f"{compiler} -mno-avx512f"}
    done = subprocess.run(
        [sys.executable, "-c", _AVX2_PROBE], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert f"LANES 8 ROWS {NATIVE_LINEAR_MAX_ROWS}" in done.stdout, done.stdout
    worst = float(done.stdout.split("WORST")[1].split()[0])
    assert worst < 1e-4, done.stdout
    # the decode kernel's vector path on 8 lanes (head sizes 8, 16, 24; 64 and 128 with the
    # shapes specialised for them, groups 2, 4, 6)
    assert float(done.stdout.split("DECODE_WORST")[1]) < 1e-5, done.stdout


def test_built_without_avx2_fma_it_says_why_and_the_backend_uses_onednn(tmp_path: Path) -> None:
    """A compiler told to leave FMA out builds the library (the decode kernel runs)
    but the linear kernel reports the CPU features it needs."""
    compiler = os.environ.get("CC", "cc")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path), "CC": f"{compiler} -mno-fma"}
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "LINEAR the native linear kernel needs a CPU with AVX2, FMA and F16C" in done.stdout
    assert "DECODE None" in done.stdout
    assert "CLOSE True" in done.stdout
