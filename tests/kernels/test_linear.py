"""hwplug.kernels.linear: oneDNN-packed linear layers agree with nn.Linear and fall back safely."""

from __future__ import annotations

import copy
import io

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from hwplug.kernels.linear import (
    MIN_PACKED_BYTES,
    PackedLinear,
    pack_linears,
    packing_unavailable_reason,
)

pytestmark = pytest.mark.skipif(
    packing_unavailable_reason(torch.ones(2, 2)) is not None,
    reason=f"no oneDNN packing here: {packing_unavailable_reason(torch.ones(2, 2))}",
)


def _linear(n_in: int, n_out: int, *, bias: bool, dtype: torch.dtype = torch.float32) -> nn.Linear:
    torch.manual_seed(n_in * 131 + n_out)
    return nn.Linear(n_in, n_out, bias=bias, dtype=dtype).requires_grad_(False)


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(0, 40),
    n_in=st.integers(1, 96),
    n_out=st.integers(1, 96),
    bias=st.booleans(),
    leading=st.sampled_from([(), (3,), (2, 1)]),
)
def test_packed_equals_nn_linear(
    rows: int, n_in: int, n_out: int, bias: bool, leading: tuple[int, ...]
) -> None:
    dense = _linear(n_in, n_out, bias=bias)
    packed = PackedLinear.from_linear(dense)
    x = torch.randn(*leading, rows, n_in)
    got = packed(x)
    assert got.shape == (*leading, rows, n_out)
    torch.testing.assert_close(got, dense(x), rtol=1e-5, atol=1e-5)


def test_bfloat16_weights_pack_and_agree() -> None:
    dense = _linear(64, 48, bias=True, dtype=torch.bfloat16)
    if packing_unavailable_reason(dense.weight) is not None:
        pytest.skip(str(packing_unavailable_reason(dense.weight)))
    x = torch.randn(5, 64, dtype=torch.bfloat16)
    got = PackedLinear.from_linear(dense)(x)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), dense(x).float(), rtol=2e-2, atol=2e-2)


def test_non_contiguous_input_is_handled() -> None:
    dense = _linear(32, 16, bias=False)
    x = torch.randn(32, 10).t()  # [10, 32], strided
    torch.testing.assert_close(PackedLinear.from_linear(dense)(x), dense(x))


def test_a_weight_changed_in_place_is_repacked() -> None:
    dense = _linear(16, 8, bias=True)
    packed = PackedLinear.from_linear(dense)
    x = torch.randn(4, 16)
    packed(x)
    with torch.no_grad():
        dense.weight.mul_(-2.0)
    torch.testing.assert_close(packed(x), dense(x))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_a_layer_converted_after_packing_still_computes(dtype: torch.dtype) -> None:
    model = nn.Sequential(_linear(32, 16, bias=True))
    pack_linears(model, min_bytes=0)
    model.to(dtype)
    x = torch.randn(4, 32, dtype=dtype)
    want = torch.nn.functional.linear(x.double(), model[0].weight.double(), model[0].bias.double())
    tol = 1e-6 if dtype == torch.float64 else 5e-2
    torch.testing.assert_close(model(x).double(), want, rtol=tol, atol=tol)


def test_load_state_dict_after_packing_takes_effect() -> None:
    model = nn.Sequential(_linear(16, 8, bias=True))
    names = pack_linears(model, min_bytes=0)
    assert names == ["0"]
    other = _linear(16, 8, bias=True)
    with torch.no_grad():
        other.weight.normal_()
    model.load_state_dict({"0.weight": other.weight, "0.bias": other.bias})
    x = torch.randn(3, 16)
    torch.testing.assert_close(model(x), other(x))


def test_pack_linears_swaps_linears_keeps_state_dict_and_ties() -> None:
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(50, 16)
            self.body = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16, bias=False))
            self.head = nn.Linear(16, 50, bias=False)
            self.head.weight = self.embed.weight

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.head(self.body(self.embed(ids)))

    torch.manual_seed(0)
    model = Tied().eval().requires_grad_(False)
    ids = torch.randint(0, 50, (2, 7))
    before = model(ids)
    keys = list(model.state_dict())
    names = pack_linears(model, min_bytes=0)
    assert sorted(names) == ["body.0", "body.2", "head"]
    assert all(isinstance(model.get_submodule(n), PackedLinear) for n in names)
    assert isinstance(model.body[1], nn.ReLU)
    assert list(model.state_dict()) == keys
    assert model.head.weight is model.embed.weight
    torch.testing.assert_close(model(ids), before)
    assert pack_linears(model, min_bytes=0) == []  # already packed: nothing left to swap


def test_compiled_graphs_call_the_packed_op() -> None:
    model = nn.Sequential(_linear(24, 40, bias=True), nn.SiLU(), _linear(40, 8, bias=False))
    x = torch.randn(6, 24)
    expected = model(x)
    pack_linears(model, min_bytes=0)
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    torch.testing.assert_close(compiled(x), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(compiled(x[:1]), expected[:1], rtol=1e-5, atol=1e-5)


def test_autograd_still_works_through_the_dense_weight() -> None:
    dense = nn.Linear(8, 4)
    packed = PackedLinear.from_linear(dense)
    x = torch.randn(3, 8, requires_grad=True)
    packed(x).sum().backward()
    assert x.grad is not None and dense.weight.grad is not None
    torch.testing.assert_close(dense.weight.grad, x.detach().sum(0).expand(4, 8))


def test_a_saved_and_loaded_model_packs_again() -> None:
    model = nn.Sequential(_linear(64, 32, bias=True))
    pack_linears(model, min_bytes=0)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert isinstance(loaded[0], PackedLinear)
    x = torch.randn(3, 64)
    torch.testing.assert_close(loaded(x), model(x))
    with torch.no_grad():
        loaded[0].weight.zero_()
    torch.testing.assert_close(loaded(x), loaded[0].bias.expand(3, 32))
    torch.testing.assert_close(
        model(x), torch.nn.functional.linear(x, model[0].weight, model[0].bias)
    )


def test_a_copy_computes_with_its_own_weight() -> None:
    packed = PackedLinear.from_linear(_linear(8, 4, bias=False))
    twin = copy.deepcopy(packed)
    with torch.no_grad():
        twin.weight.fill_(1.0)
    x = torch.randn(2, 8)
    torch.testing.assert_close(twin(x), x.sum(-1, keepdim=True).expand(2, 4))
    torch.testing.assert_close(packed(x), torch.nn.functional.linear(x, packed.weight))


def test_weights_off_the_cpu_are_left_alone() -> None:
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4, 4))
    assert pack_linears(model, min_bytes=0) == []
    assert type(model[0]) is nn.Linear
    reason = packing_unavailable_reason(model[0].weight)
    assert reason is not None and "meta" in reason and "CPU" in reason
    with pytest.raises(ValueError, match="PackedLinear: the weight is on meta"):
        PackedLinear.from_linear(model[0])


@pytest.mark.parametrize(
    ("weight", "words"),
    [
        (torch.ones(3, dtype=torch.float32), "2-d"),
        (torch.ones(2, 2, dtype=torch.float64), "float64"),
        (torch.ones(2, 2, dtype=torch.int32), "int32"),
    ],
)
def test_unpackable_weights_say_why(weight: torch.Tensor, words: str) -> None:
    reason = packing_unavailable_reason(weight)
    assert reason is not None and words in reason
    with pytest.raises(ValueError, match="PackedLinear: "):
        PackedLinear(weight, None)


def test_float16_packs_only_where_the_cpu_can() -> None:
    weight = torch.ones(4, 4, dtype=torch.float16)
    reason = packing_unavailable_reason(weight)
    if reason is None:
        torch.testing.assert_close(
            PackedLinear(weight, None)(torch.ones(1, 4).half()), weight[:1] * 4
        )
    else:
        assert "float16" in reason
        assert pack_linears(nn.Sequential(nn.Linear(4, 4, dtype=torch.float16)), min_bytes=0) == []


def test_a_bad_bias_is_refused() -> None:
    with pytest.raises(ValueError, match=r"bias must be \[4\] in float32; got \[3\]"):
        PackedLinear(torch.ones(4, 2), torch.ones(3))


def test_pack_linears_needs_a_module() -> None:
    with pytest.raises(TypeError, match="needs a torch.nn.Module, got dict"):
        pack_linears({})  # type: ignore[arg-type]


def test_without_onednn_nothing_is_packed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    model = nn.Sequential(nn.Linear(4, 4))
    assert pack_linears(model, min_bytes=0) == []
    reason = packing_unavailable_reason(model[0].weight)
    assert reason is not None and "oneDNN" in reason


def test_by_default_only_weights_worth_packing_are_packed() -> None:
    model = nn.Sequential(
        nn.Linear(32, 32, bias=False),  # 4 KiB: a packed call would cost more than it saves
        nn.Linear(512, 512, bias=False),  # 1 MiB
    ).requires_grad_(False)
    assert MIN_PACKED_BYTES == 1 << 20
    assert pack_linears(model) == ["1"]
    assert type(model[0]) is nn.Linear
    assert pack_linears(model, min_bytes=4096) == ["0"]


@pytest.mark.parametrize("bad", [-1, 1.5, True, "1"])
def test_min_bytes_must_be_a_non_negative_integer(bad: object) -> None:
    with pytest.raises(ValueError, match="min_bytes must be a non-negative integer, got"):
        pack_linears(nn.Sequential(), min_bytes=bad)  # type: ignore[arg-type]
