"""``hwplug.kernels.linear``: the platform's GEMM for dense linear layers.

The CPU backends (``native``: hwplug's kernel for few rows, oneDNN beyond;
``onednn``) must give the product ``torch.nn.functional.linear`` gives, read
the weight where it lies (an in-place update is seen, no copy is kept), fall
back where they cannot run, and stay one opaque op under ``torch.compile``.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import hwplug
import hwplug.core.platform
from hwplug.kernels import LINEAR_BACKENDS, linear
from hwplug.kernels.linear import onednn_dtypes

needs_onednn = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="this torch has no oneDNN"
)
CPU_BACKENDS = ["native", "onednn"]
TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 2e-3}


def _close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> bool:
    if b.numel() == 0:
        return a.shape == b.shape
    scale = max(1.0, float(b.float().abs().max()))
    return bool((a.float() - b.float()).abs().max() <= TOL[dtype] * scale)


@needs_onednn
@settings(max_examples=40, deadline=None)
@given(
    lead=st.lists(st.integers(1, 5), min_size=0, max_size=2),
    rows=st.integers(0, 40),
    k=st.integers(0, 96),
    n=st.integers(0, 96),
    bias=st.booleans(),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
    seed=st.integers(0, 2**16),
    backend=st.sampled_from(CPU_BACKENDS),
)
def test_the_cpu_backends_give_torchs_product(
    lead: list[int],
    rows: int,
    k: int,
    n: int,
    bias: bool,
    dtype: torch.dtype,
    seed: int,
    backend: str,
) -> None:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(*lead, rows, k, generator=gen).to(dtype)
    w = torch.randn(n, k, generator=gen).to(dtype)
    b = torch.randn(n, generator=gen).to(dtype) if bias else None
    got = linear(x, w, b, backend=backend)
    want = torch.nn.functional.linear(x.float(), w.float(), None if b is None else b.float())
    assert got.shape == (*lead, rows, n)
    assert got.dtype == dtype
    assert _close(got, want, dtype)


@needs_onednn
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_an_in_place_update_of_the_weight_is_seen_by_the_next_call(backend: str) -> None:
    x, w, b = torch.randn(4, 16), torch.randn(8, 16), torch.randn(8)
    before = linear(x, w, b, backend=backend)
    with torch.no_grad():
        w.mul_(-2.0)
        b.add_(1.0)
    after = linear(x, w, b, backend=backend)
    assert not torch.allclose(before, after)
    assert torch.allclose(after, torch.nn.functional.linear(x, w, b), atol=1e-4)


@needs_onednn
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_a_strided_weight_and_input_are_read_where_they_lie(backend: str) -> None:
    x = torch.randn(24, 10).t()  # a transposed view
    for w in (torch.randn(32, 24)[::2], torch.randn(24, 12).t()):  # every other row; transposed
        assert not w.is_contiguous() and not x.is_contiguous()
        got = linear(x, w, backend=backend)
        assert torch.allclose(got, torch.nn.functional.linear(x, w), atol=1e-4)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_autograd_falls_back_to_torch_and_gets_gradients(backend: str) -> None:
    x = torch.randn(3, 5, requires_grad=True)
    w = torch.randn(4, 5, requires_grad=True)
    linear(x, w, backend=backend).sum().backward()
    assert x.grad is not None and w.grad is not None
    assert torch.allclose(w.grad, x.detach().sum(0).expand(4, 5))


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_integer_and_mixed_dtypes_fall_back_to_torch(backend: str) -> None:
    x, w = torch.randn(2, 3, dtype=torch.float64), torch.randn(4, 3, dtype=torch.float64)
    assert torch.equal(linear(x, w, backend=backend), torch.nn.functional.linear(x, w))
    with pytest.raises(RuntimeError):  # torch's own error for mixed dtypes
        linear(torch.randn(2, 3), w, backend=backend)


def test_an_unknown_backend_is_a_value_error_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown linear backend 'mkl'.*torch, native, onednn"):
        linear(torch.randn(2, 3), torch.randn(4, 3), backend="mkl")
    assert LINEAR_BACKENDS == ("torch", "native", "onednn")


@needs_onednn
@pytest.mark.parametrize("backend_name", CPU_BACKENDS)
def test_under_torch_compile_it_is_the_opaque_custom_op(backend_name: str) -> None:
    x, w, b = torch.randn(5, 16), torch.randn(12, 16), torch.randn(12)
    ops: list[str] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]):  # type: ignore[no-untyped-def]
        ops.extend(str(node.target) for node in gm.graph.nodes if node.op == "call_function")
        return gm.forward

    compiled = torch.compile(
        lambda x, w, b: linear(x, w, b, backend=backend_name).relu(),
        backend=backend,
        fullgraph=True,
    )
    got = compiled(x, w, b)
    assert torch.allclose(got, torch.nn.functional.linear(x, w, b).relu(), atol=1e-4)
    assert any(op.startswith(f"hwplug.{backend_name}_linear") for op in ops), ops
    inductor = torch.compile(lambda x, w: linear(x, w, backend=backend_name) * 2, dynamic=True)
    for rows in (1, 7, 100):  # both sides of the native kernel's row limit, one graph
        xr = torch.randn(rows, 16)
        assert torch.allclose(inductor(xr, w), 2 * torch.nn.functional.linear(xr, w), atol=1e-4)


def test_the_platforms_name_their_gemm() -> None:
    def platform(name: str) -> hwplug.core.platform.Platform:
        return hwplug.resolve(platform=name).platform

    assert platform("cpu-generic").linear_backend == "native"
    assert platform("h100").linear_backend == "torch"
    for name in ("cpu-generic", "xeon-spr", "h100", "mi300x", "gaudi2", "max-1550"):
        assert platform(name).linear_backend in LINEAR_BACKENDS


@needs_onednn
def test_float32_is_always_native_and_16_bit_only_where_the_cpu_has_it() -> None:
    native = onednn_dtypes()
    assert torch.float32 in native
    assert native <= {torch.float32, torch.bfloat16, torch.float16}
    assert (torch.bfloat16 in native) == bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


@needs_onednn
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows", [1, 2, 3, 17])
def test_a_16_bit_weight_larger_than_a_converted_piece_gives_the_float32_product(
    dtype: torch.dtype, rows: int
) -> None:
    """Without native 16-bit kernels the weight is converted a piece at a time (here
    2500 output features of 1024 inputs: three pieces); with them, oneDNN's own. Either
    way the product is the float32 one rounded to the input's dtype."""
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 1024, generator=gen).to(dtype)
    w = (torch.randn(2500, 1024, generator=gen) / 32).to(dtype)
    b = torch.randn(2500, generator=gen).to(dtype)
    got = linear(x, w, b, backend="onednn")
    want = torch.nn.functional.linear(x.float(), w.float(), b.float())
    assert got.dtype == dtype and got.shape == (rows, 2500)
    assert _close(got, want, dtype)
