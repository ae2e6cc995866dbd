"""The native linear kernel's bfloat16 paths: AMX tiles, AVX-512 BF16 dot products and
the one-row tiles of the vector path.

Where the CPU has AMX-BF16 (and the OS lets the process use it) bfloat16
inputs times bfloat16 weights whose in features are a multiple of 32 and out
features of 16 run on tiles; where it has AVX512_BF16 (AMD Zen 4, Intel
Cooper Lake and later) the products AMX does not take run on VDPBF16PS.
Both read the weight where it lies, and are judged against float64 over
generated shapes (rows on both sides of a tile pass, strided rows of the
input and of the weight, a bias, an output inside a wider buffer; for the
dot products, in features that are not a multiple of the 32 a step takes).
A build without either (a compiler told to leave them out) is exercised in
a new process on every machine: it says so, and the row limits and products
are those of the vector path and oneDNN.
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
    cpu_linear,
    linear,
    native_linear,
    native_linear_amx,
    native_linear_dpbf16,
    native_linear_rows,
    native_linear_unavailable_reason,
)

_RUNS = native_linear_unavailable_reason() is None
needs_amx = pytest.mark.skipif(
    not _RUNS or not native_linear_amx(),
    reason="the native linear kernel has no AMX path on this CPU",
)
needs_dpbf16 = pytest.mark.skipif(
    not _RUNS or not native_linear_dpbf16(),
    reason="the native linear kernel has no AVX-512 BF16 path on this CPU",
)
# each path with a weight shape ([out, in] features) it takes and the other does not
PATHS = [
    pytest.param(32, 64, marks=needs_amx, id="amx"),
    pytest.param(31, 70, marks=needs_dpbf16, id="dpbf16"),
]


def _assert_close(got: torch.Tensor, want: torch.Tensor, k: int) -> None:
    """Float32 sums of ``k`` exact products of bfloat16 pairs."""
    assert got.dtype == torch.float32 and got.shape == want.shape
    tolerance = 1e-5 * max(1.0, math.sqrt(k)) * max(1.0, float(want.abs().max()))
    assert float((got.double() - want).abs().max()) <= tolerance


def _check_product(
    rows: int, k: int, n: int, bias: bool, x_pad: int, w_pad: int, seed: int
) -> None:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k + x_pad, generator=gen).bfloat16()[:, :k]
    w = torch.randn(n, k + w_pad, generator=gen).bfloat16()[:, :k]
    b = torch.randn(n, generator=gen) if bias else None
    out = torch.full((rows, n + 5), 7.0)
    got = native_linear(x, w, b, out=out[:, :n])
    want = torch.nn.functional.linear(x.double(), w.double(), None if b is None else b.double())
    _assert_close(got, want, k)
    assert torch.equal(out[:, n:], torch.full((rows, 5), 7.0))  # nothing written past it


_PADS = {
    "bias": st.booleans(),
    "x_pad": st.sampled_from([0, 1, 32]),
    "w_pad": st.sampled_from([0, 3, 32]),
    "seed": st.integers(0, 2**16),
}


@needs_amx
@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 70),
    k=st.sampled_from([32, 64, 96, 160, 512]),
    n=st.sampled_from([16, 32, 48, 80, 128]),
    **_PADS,
)
def test_tiles_give_the_float64_product_of_the_bfloat16_values(
    rows: int, k: int, n: int, bias: bool, x_pad: int, w_pad: int, seed: int
) -> None:
    _check_product(rows, k, n, bias, x_pad, w_pad, seed)


@needs_dpbf16
@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 40), k=st.integers(1, 140), n=st.integers(1, 50), **_PADS)
def test_dot_products_give_the_float64_product_of_the_bfloat16_values(
    rows: int, k: int, n: int, bias: bool, x_pad: int, w_pad: int, seed: int
) -> None:
    # (shapes AMX also takes go to AMX where it runs: the product is checked either way)
    _check_product(rows, k, n, bias, x_pad, w_pad, seed)


@pytest.mark.parametrize(("n", "k"), PATHS)
def test_special_values_propagate(n: int, k: int) -> None:
    x = torch.ones(20, k, dtype=torch.bfloat16)
    w = torch.ones(n, k, dtype=torch.bfloat16)
    x[17, 3] = float("nan")
    w[5, k - 4] = float("inf")  # (past the last whole step of 32 for the dot products)
    got = native_linear(x, w)
    assert torch.isnan(got[17]).all()
    others = [r for r in range(20) if r != 17]
    assert torch.isinf(got[others, 5]).all()
    got[17] = 0
    got[:, 5] = 0
    assert torch.equal(got, torch.where(got == 0, 0.0, float(k)))


@pytest.mark.parametrize(("n", "k"), PATHS)
def test_a_bfloat16_result_is_rounded_as_torch_rounds_it(n: int, k: int) -> None:
    """The paths write a bfloat16 result themselves: the float32 sum plus bias rounded to
    nearest even, ties included, as ``.to(torch.bfloat16)`` rounds it (NaN stays NaN)."""
    ties = [1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 2**-130 + 2**-140, 3.4e38, -3.4e38]
    specials = [float("inf"), float("-inf"), float("nan"), 0.0, -0.0, 1e-40]
    rest = [0.1 * i for i in range(n - len(ties) - len(specials))]
    bias = torch.tensor(ties + specials + rest, dtype=torch.float32)
    gen = torch.Generator().manual_seed(3)
    x = torch.zeros(3, k, dtype=torch.bfloat16)
    x[1] = torch.randn(k, generator=gen).bfloat16()
    w = torch.randn(n, k, generator=gen).bfloat16()
    got = cpu_linear.run(x, w, bias, dtype=torch.bfloat16)
    want = cpu_linear.run(x, w, bias).to(torch.bfloat16)
    assert got.dtype == torch.bfloat16
    nan = want.isnan()
    assert torch.equal(got.isnan(), nan) and nan.any()
    assert torch.equal(got[~nan].view(torch.int16), want[~nan].view(torch.int16))
    assert got[0, 0] == 1.0 and got[0, 1] == 1 + 2**-6 and got[0, 4] == float("inf")


@pytest.mark.parametrize(("n", "k"), PATHS)
def test_an_in_place_update_of_the_weight_is_seen(n: int, k: int) -> None:
    x = torch.randn(8, k).bfloat16()
    w = torch.randn(n, k).bfloat16()
    before = native_linear(x, w)
    w.mul_(-2.0)  # exact in bfloat16
    assert torch.equal(native_linear(x, w), -2.0 * before)


@pytest.mark.parametrize(("n", "k"), PATHS)
@pytest.mark.parametrize("rows", [1, 5, 16, 32, 33, 64])
def test_the_native_backend_takes_bfloat16_up_to_32_rows_and_oneDNN_beyond(
    rows: int, n: int, k: int
) -> None:
    assert native_linear_rows(torch.bfloat16) == 32
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, k, generator=gen).bfloat16()
    w = torch.randn(n, k, generator=gen).bfloat16()
    b = torch.randn(n, generator=gen).bfloat16()
    got = linear(x, w, b, backend="native")
    assert got.dtype == torch.bfloat16
    want = torch.nn.functional.linear(x.double(), w.double(), b.double())
    # one rounding to bfloat16 of the float32 sum
    assert float((got.double() - want).abs().max()) <= 2**-7 * float(want.abs().max())
    if rows <= 32:
        assert torch.equal(got, native_linear(x, w, b).to(torch.bfloat16))


# -- one bfloat16 row: the vector path's one-row tiles ("row") -------------------------------

needs_row = pytest.mark.skipif(
    not _RUNS
    or cpu_linear.pairs_path(torch.ones(1, 32).bfloat16(), torch.ones(16, 32).bfloat16()) != "row",
    reason="one bfloat16 row takes another path here (AMX, AVX-512 BF16, or no one-row tiles)",
)


@needs_row
@settings(max_examples=80, deadline=None)
@given(
    k=st.integers(0, 300),  # steps of 16 (32 with AVX-512) and a tail
    n=st.integers(1, 60),  # tiles of 12 rows of the weight, and the rest by the tile path
    threads=st.sampled_from([1, 2, 3]),
    **_PADS,
)
def test_one_row_gives_the_float64_product(
    k: int, n: int, threads: int, bias: bool, x_pad: int, w_pad: int, seed: int
) -> None:
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        _check_product(1, k, n, bias, x_pad, w_pad, seed)
    finally:
        torch.set_num_threads(previous)


@needs_row
@pytest.mark.parametrize(("n", "k"), [(12, 4096), (13, 4097), (25, 9000)])
def test_one_row_with_long_rows_gives_the_float64_product(n: int, k: int) -> None:
    """In features past what the kernel keeps on its stack take a buffer of their own."""
    _check_product(1, k, n, True, 1, 3, n)


@needs_row
@pytest.mark.parametrize(("n", "k"), [(24, 48), (29, 37)])
def test_one_row_propagates_special_values_and_rounds_as_torch(n: int, k: int) -> None:
    x = torch.ones(1, k, dtype=torch.bfloat16)
    w = torch.ones(n, k, dtype=torch.bfloat16)
    w[5, k - 4] = float("inf")
    w[n - 1, 2] = float("nan")  # in the part the tile path takes when n % 12 != 0
    got = native_linear(x, w)
    assert torch.isinf(got[0, 5]) and torch.isnan(got[0, n - 1])
    got[0, 5] = got[0, n - 1] = float(k)
    assert torch.equal(got, torch.full((1, n), float(k)))
    ties = [1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 3.4e38, float("inf"), float("nan"), -0.0]
    bias = torch.tensor(ties + [0.1 * i for i in range(n - len(ties))], dtype=torch.float32)
    x = torch.zeros(1, k, dtype=torch.bfloat16)
    x[0, 1] = 0.25
    w = w.nan_to_num(0.0, 0.0, 0.0)
    got = cpu_linear.run(x, w, bias, dtype=torch.bfloat16)
    want = cpu_linear.run(x.float(), w, bias).to(torch.bfloat16)  # the float32 door, rounded
    assert got.dtype == torch.bfloat16
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got[~want.isnan()].view(torch.int16), want[~want.isnan()].view(torch.int16))


@needs_row
def test_one_row_is_what_the_engine_step_and_the_float32_door_give() -> None:
    """The engine's door (``linear(backend="native")``, bfloat16 in and out, one row) and
    the float32 door of the same kernel agree bit for bit after rounding."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(1, 1000, generator=gen).bfloat16()
    w = torch.randn(250, 1000, generator=gen).bfloat16()
    b = torch.randn(250, generator=gen).bfloat16()
    got = linear(x, w, b, backend="native")
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, native_linear(x.float(), w, b.float()).to(torch.bfloat16))


_NO_AMX_PROBE = """
import torch
from hwplug.kernels import (
    linear, native_linear, native_linear_amx, native_linear_dpbf16, native_linear_rows
)
from hwplug.kernels.linear import onednn_dtypes
print("AMX", native_linear_amx(), native_linear_dpbf16())
print("ROWS", native_linear_rows(torch.bfloat16), torch.bfloat16 in onednn_dtypes())
x, w = torch.randn(20, 64).bfloat16(), torch.randn(32, 64).bfloat16()
want = x.double() @ w.double().t()
print("ERR", float((native_linear(x, w).double() - want).abs().max()))
print("ERR_BACKEND", float((linear(x, w, backend="native").double() - want).abs().max()))
"""


def test_built_without_amx_or_bf16_dot_products_it_says_so_and_bfloat16_keeps_the_others(
    tmp_path: Path,
) -> None:
    compiler = os.environ.get("CC", "cc")
    env = {
        **os.environ,
        "XDG_CACHE_HOME": str(tmp_path),
        "CC": f"{compiler} -mno-amx-tile -mno-amx-bf16 -mno-avx512bf16",
    }
    done = subprocess.run(
        [sys.executable, "-c", _NO_AMX_PROBE], capture_output=True, text=True, env=env, timeout=300
    )
    if "unrecognized command-line option" in done.stderr:
        pytest.skip("this compiler knows no AMX options")
    assert done.returncode == 0, done.stderr
    assert "AMX False False" in done.stdout, done.stdout
    rows, native_bf16 = done.stdout.split("ROWS ")[1].split("\n")[0].split()
    if native_linear_unavailable_reason() is None:
        # 4 rows where oneDNN multiplies bfloat16 itself, else the kernel's maximum
        assert int(rows) == (4 if native_bf16 == "True" else 64), done.stdout
    assert float(done.stdout.split("ERR ")[1].split()[0]) < 1e-3, done.stdout
    assert float(done.stdout.split("ERR_BACKEND ")[1].split()[0]) < 0.5, done.stdout
