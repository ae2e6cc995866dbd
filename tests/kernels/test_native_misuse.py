"""The native kernels as a careless or hostile caller would use them: never a crash, never
a wrong answer.

Whatever torch computes, the native entry points compute too (any strides);
whatever torch refuses, they refuse with a ``ValueError`` (or ``TypeError``)
naming the argument, its value and what is allowed; every index a kernel
reads from a tensor is bounded. Each risky case runs in a worker process
(the ``isolated`` fixture), so a kernel that crashes fails its case instead
of the suite. The numbered tests are the defects of issue 38; the
hypothesis tests generate shapes, strides, dtypes, aliasing and index values
at and past every bound.
"""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hwplug.kernels import (
    NATIVE_CACHE_DTYPES,
    KernelArgumentError,
    linear,
    native_decode_unavailable_reason,
    native_linear_unavailable_reason,
    paged_decode_attention,
)
from tests.kernels import native_cases
from tests.kernels.isolated import Isolated

pytestmark = pytest.mark.skipif(
    native_linear_unavailable_reason() is not None
    or native_decode_unavailable_reason() is not None,
    reason=f"the native kernels cannot run here: {native_linear_unavailable_reason()}",
)

FUZZ = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
FLOATS = (torch.float32, torch.bfloat16, torch.float16)
CALLS = ["native", "onednn", "native_linear", "op:native_linear", "op:onednn_linear"]
"""How a linear reaches a kernel: ``linear(backend=...)``, ``native_linear`` and the
registered ops called directly (``torch.ops.hwplug...``), as anyone may call them."""


# -- 1-4: linear --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("x_k", "w_k"),
    [(2**24, 64), (65, 64), (63, 64), (1, 64)],
    ids=["far wider", "wider", "narrower", "one"],
)
@pytest.mark.parametrize("call", CALLS)
def test_1_an_input_whose_features_are_not_the_weights_is_refused(
    isolated: Isolated, call: str, x_k: int, w_k: int
) -> None:
    message = isolated(
        native_cases.refused_linear_case,
        {"call": call, "rows": 2, "x_k": x_k, "n": 16, "w_k": w_k, "bias": None},
    )
    assert f"in_features = {w_k}" in message and f"in_features is {x_k}" in message, message


@pytest.mark.parametrize("call", ["native", "onednn", "native_linear"])
def test_2_a_bias_of_one_element_broadcasts_as_torchs_does(isolated: Isolated, call: str) -> None:
    spec = {"seed": 2, "rows": 3, "k": 64, "n": 64, "bias": True}
    if call == "native_linear":
        spec |= {"x_dtype": torch.float32, "w_dtype": torch.float32, "x_layout": "contiguous",
                 "w_layout": "contiguous", "out_layout": None, "bias": "one"}  # fmt: skip
        assert isolated(native_cases.native_linear_case, spec) == "ok"
        return
    x, w, bias = torch.randn(3, 64), torch.randn(64, 64), torch.randn(1)
    torch.testing.assert_close(
        linear(x, w, bias, backend=call), torch.nn.functional.linear(x, w, bias)
    )


@pytest.mark.parametrize("size", [3, 65, 128])
@pytest.mark.parametrize("call", CALLS)
def test_2_a_bias_that_does_not_broadcast_is_refused(
    isolated: Isolated, call: str, size: int
) -> None:
    message = isolated(
        native_cases.refused_linear_case,
        {"call": call, "rows": 2, "x_k": 32, "n": 64, "w_k": 32, "bias": size},
    )
    assert "bias" in message and str(size) in message and "64" in message, message


@pytest.mark.parametrize("out", ["x", "x rows", "weight", "bias"])
def test_3_an_out_that_shares_memory_with_an_input_is_refused(isolated: Isolated, out: str) -> None:
    message = isolated(native_cases.aliased_out_case, {"k": 8, "out": out})
    assert re.search(r"out (shares memory with|is written, but several)", message), message


@pytest.mark.parametrize("backend", ["onednn", "native"])
def test_4_a_shape_error_names_both_shapes(backend: str) -> None:
    x, w = torch.randn(2, 3, 40), torch.randn(16, 32)  # more rows than the kernel takes too
    with pytest.raises(
        ValueError,
        match=r"weight has in_features = 32 \(shape \[16, 32\]\), but x's in_features is 40",
    ):
        linear(x, w, backend=backend)
    with pytest.raises(RuntimeError):  # as torch.nn.functional.linear raises
        linear(torch.randn(200, 40), w, backend=backend)
    with pytest.raises(ValueError, match="linear: x must have at least one dimension"):
        linear(torch.tensor(1.0), w, backend=backend)


# -- 5-7: decode attention ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("seq_lens", "query_lens"), [([9, 17, 5], [1, 1, 1]), ([9, 17, 12], [1, 1, 4])],
    ids=["decodes", "decodes then a prefill"],
)  # fmt: skip
@pytest.mark.parametrize("through", ["forward", "op"])
def test_5_a_query_that_is_dense_but_not_row_major_attends_as_a_row_major_one(
    isolated: Isolated, dtype: torch.dtype, seq_lens: list[int], query_lens: list[int], through: str
) -> None:
    spec = {"seed": 5, "seq_lens": seq_lens, "query_lens": query_lens, "head_size": 64,
            "dtype": dtype, "through": through}  # fmt: skip
    assert isolated(native_cases.query_layout_case, spec) == "ok"


@pytest.mark.parametrize(
    ("change", "value", "message"),
    [
        ("slot", 2**40, "slot 1099511627776 of new row 0 is past the caches'"),
        ("block", 2**30, "block_table[0, 0] = 1073741824 is not a block of the caches"),
        ("block", -1, "block_table[0, 0] = -1 is not a block of the caches"),
    ],
)
def test_6_metadata_changed_after_prepare_is_refused_not_followed(
    isolated: Isolated, change: str, value: int, message: str
) -> None:
    spec = {"seed": 6, "seq_lens": [9, 6], "query_lens": [1, 1], "head_size": 64,
            "dtype": torch.float32, "change": change, "value": value}  # fmt: skip
    got = isolated(native_cases.mutated_step_case, spec)
    assert message in got, got


def _decode_arguments() -> dict[str, object]:
    gen = torch.Generator().manual_seed(7)
    caches = torch.randn(2, 6, 4, 2, 8, generator=gen)
    return {
        "query": torch.randn(2, 4, 8, generator=gen),
        "key_cache": caches[0],
        "value_cache": caches[1],
        "block_table": torch.tensor([[0, 1, 2], [3, 4, 5]]),
        "seq_lens": torch.tensor([5, 9]),
        "scale": 0.5,
    }


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"sliding_window": 2.5}, "sliding_window must be an integer; got 2.5"),
        ({"sliding_window": "4"}, "sliding_window must be an integer; got '4'"),
        ({"query": torch.ones(2, 4, 8, dtype=torch.int64)}, "query must be a floating-point tensor; got int64"),
        ({"block_table": torch.ones(2, 3, dtype=torch.bool)}, "block_table must be an integer tensor (not bool); got bool"),
        ({"seq_lens": torch.ones(2, dtype=torch.bool)}, "seq_lens must be an integer tensor (not bool); got bool"),
    ],
)  # fmt: skip
def test_7_wrong_types_are_value_errors_that_name_the_argument(
    change: dict[str, object], message: str
) -> None:
    arguments = _decode_arguments() | change
    with pytest.raises(ValueError, match=re.escape(message)):
        paged_decode_attention(**arguments)  # type: ignore[arg-type]


def test_7_a_float_window_is_a_type_error_too() -> None:
    with pytest.raises(TypeError, match="sliding_window"):
        paged_decode_attention(**(_decode_arguments() | {"sliding_window": 2.5}))  # type: ignore[arg-type]


def test_7_bool_slot_mappings_are_refused_by_the_step_call() -> None:
    from hwplug.kernels import cpu_decode

    arguments = _decode_arguments()
    rows = torch.randn(2, 2, 8)
    with pytest.raises(ValueError, match=re.escape("slots must be an integer tensor (not bool)")):
        cpu_decode.run(
            arguments["query"], arguments["key_cache"], arguments["value_cache"],  # type: ignore[arg-type]
            arguments["block_table"], arguments["seq_lens"], scale=0.5, sliding_window=None,  # type: ignore[arg-type]
            write=(rows, rows, torch.tensor([True, False])),
        )  # fmt: skip


# -- generated cases ---------------------------------------------------------------------------

_LINEAR_LAYOUTS = st.sampled_from(native_cases.LAYOUTS)


@FUZZ
@given(
    rows=st.integers(0, 40),
    k=st.integers(1, 70),
    n=st.integers(1, 40),
    x_dtype=st.sampled_from((*FLOATS, torch.float64)),
    w_dtype=st.sampled_from(FLOATS),
    x_layout=_LINEAR_LAYOUTS,
    w_layout=_LINEAR_LAYOUTS,
    bias=st.sampled_from([None, "full", "one", "scalar"]),
    out_layout=st.sampled_from([None, "contiguous", "permuted", "sliced", "strided"]),
    seed=st.integers(0, 2**16),
)
def test_native_linear_matches_float64_for_any_layout(isolated: Isolated, **spec: object) -> None:
    if spec["rows"] == 0 and spec["x_layout"] == "expanded":
        spec["x_layout"] = "contiguous"
    assert isolated(native_cases.native_linear_case, spec) == "ok"


@FUZZ
@given(
    rows=st.integers(1, 40),
    k=st.integers(1, 70),
    n=st.integers(1, 40),
    dtype=st.sampled_from(FLOATS),
    x_layout=_LINEAR_LAYOUTS,
    w_layout=_LINEAR_LAYOUTS,
    bias=st.booleans(),
    backend=st.sampled_from(["native", "onednn", "op:native_linear", "op:onednn_linear"]),
    seed=st.integers(0, 2**16),
)
def test_linear_backends_match_float64_for_any_layout(isolated: Isolated, **spec: object) -> None:
    assert isolated(native_cases.backend_linear_case, spec) == "ok"


@pytest.mark.parametrize("op", ["native_linear", "onednn_linear"])
@pytest.mark.parametrize(
    ("x", "weight", "bias", "named"),
    [
        ("randn(16)", "randn(8, 16)", None, "x must be [rows, in_features] (2 dimensions)"),
        ("randn(2, 3, 16)", "randn(8, 16)", None, "x must be [rows, in_features]"),
        ("randn(3, 16)", "randn(8, 16, 1)", None, "weight must be [out_features, in_features]"),
        ("randn(3, 16).double()", "randn(8, 16).double()", None, "x must be one of bfloat16"),
        ("randn(3, 16).bfloat16()", "randn(8, 16)", None, "weight must have x's dtype"),
        ("randn(3, 16)", "randn(8, 16)", "randn(8, 1)", "bias must be [out_features]"),
        ("randn(3, 16)", "randn(8, 16)", "randn(8).int()", "bias must be a floating"),
        ("randn(3, 16)", "randn(8, 16)", "randn(8).to_sparse()", "bias must be a dense"),
        ("randn(3, 16).to_sparse()", "randn(8, 16)", None, "x must be a dense"),
    ],
)
def test_a_direct_op_call_the_kernels_do_not_take_is_refused_naming_the_argument(
    isolated: Isolated, op: str, x: str, weight: str, bias: str | None, named: str
) -> None:
    message = isolated(native_cases.refused_op_case, op, x, weight, bias)
    assert message.startswith(f"hwplug::{op}: ") and named in message, message


@FUZZ
@given(
    rows=st.integers(1, 8),
    x_k=st.integers(1, 200),
    n=st.integers(1, 40),
    w_k=st.integers(1, 200),
    bias=st.one_of(st.none(), st.integers(0, 50)),
    call=st.sampled_from(CALLS),
)
def test_what_torch_refuses_the_native_entries_refuse(isolated: Isolated, **spec: object) -> None:
    x = torch.randn(spec["rows"], spec["x_k"])  # type: ignore[arg-type]
    w = torch.randn(spec["n"], spec["w_k"])  # type: ignore[arg-type]
    bias = None if spec["bias"] is None else torch.randn(spec["bias"])  # type: ignore[arg-type]
    # the ops' schema is the plain product: a bias of [out_features] or none
    plain = bias is None or bias.shape == (spec["n"],)
    try:
        torch.nn.functional.linear(x, w, bias)
        if str(spec["call"]).startswith("op:") and not plain:
            raise RuntimeError("the op takes no broadcast bias")
    except RuntimeError:
        message = isolated(native_cases.refused_linear_case, spec)
        assert "in_features" in message or "bias" in message
    else:
        got = linear(x, w, bias, backend="onednn" if spec["call"] == "onednn" else "native")
        torch.testing.assert_close(
            got, torch.nn.functional.linear(x, w, bias), atol=1e-4, rtol=1e-4
        )


_HEAD_SIZES = st.sampled_from([8, 16, 24, 64, 128])


@FUZZ
@given(
    lens=st.lists(st.integers(1, 70), min_size=0, max_size=5),
    kv_heads=st.integers(1, 3),
    group=st.integers(1, 9),
    head_size=_HEAD_SIZES,
    block_size=st.sampled_from([1, 3, 4, 16, 32]),
    cache_dtype=st.sampled_from(sorted(NATIVE_CACHE_DTYPES, key=str)),
    query_dtype=st.sampled_from((*FLOATS, torch.float64)),
    query_layout=st.sampled_from(native_cases.LAYOUTS),
    cache_layout=st.sampled_from(native_cases.LAYOUTS),
    table_layout=st.sampled_from(["contiguous", "permuted", "sliced", "strided"]),
    table_dtype=st.sampled_from([torch.int64, torch.int32, torch.int16]),
    lens_dtype=st.sampled_from([torch.int64, torch.int32]),
    out_layout=st.sampled_from([None, "contiguous", "permuted", "sliced", "strided"]),
    window=st.one_of(st.none(), st.integers(1, 40)),
    scale=st.floats(0.01, 1.0),
    seed=st.integers(0, 2**16),
)
def test_paged_decode_matches_float64_for_any_layout(isolated: Isolated, **spec: object) -> None:
    spec["heads"] = spec["kv_heads"] * spec.pop("group")  # type: ignore[operator]
    assert isolated(native_cases.decode_case, spec) == "ok"


def _index_values(what: str) -> st.SearchStrategy[int]:
    near = st.sampled_from(
        [-(2**63), -(2**40), -7, -1, 0, 1, 2, 2**30, 2**31, 2**40, 2**62, 2**63 - 1]
    )
    return st.one_of(near, st.integers(-3, 200))


@FUZZ
@given(
    data=st.data(),
    lens=st.lists(st.integers(1, 40), min_size=1, max_size=4),
    block_size=st.sampled_from([1, 4, 16]),
    what=st.sampled_from(["len", "block", "slot"]),
    at=st.integers(0, 3),
    seed=st.integers(0, 2**16),
)
def test_every_index_the_decode_kernel_reads_is_bounded(
    isolated: Isolated, data: st.DataObject, **spec: object
) -> None:
    value = data.draw(_index_values(str(spec["what"])), label="value")
    spec |= {
        "value": value,
        "kv_heads": 2,
        "heads": 4,
        "head_size": 16,
        "cache_dtype": torch.float32,
    }
    outcome = isolated(native_cases.decode_index_case, spec)
    lens, block_size = list(spec["lens"]), int(spec["block_size"])  # type: ignore[call-overload]
    columns = max(-(-n // block_size) for n in lens) + 1
    blocks = sum(-(-n // block_size) for n in lens) + 2
    if spec["what"] == "len":
        valid = 1 <= value <= columns * block_size
        argument = "seq_lens"
    elif spec["what"] == "block":
        valid = 0 <= value < blocks
        argument = "block_table"
    else:
        valid = value < blocks * block_size
        argument = "slot"
    if valid:
        assert outcome == "ok", outcome
    else:
        assert argument in outcome and str(value) in outcome, outcome


def test_a_worker_that_crashes_fails_its_case_only(isolated: Isolated) -> None:
    """The isolation itself: a case that kills its worker fails, and the next case runs."""
    with pytest.raises(pytest.fail.Exception, match="the worker process died"):
        isolated(_die, 11)
    assert isolated(native_cases.refused_linear_case, {"call": "native", "rows": 1, "x_k": 3,
                    "n": 2, "w_k": 4, "bias": None}).startswith("linear:")  # fmt: skip


def _die(signal_number: int) -> None:
    import os

    os.kill(os.getpid(), signal_number)


def test_kernel_argument_errors_are_value_and_runtime_errors() -> None:
    assert issubclass(KernelArgumentError, ValueError) and issubclass(
        KernelArgumentError, RuntimeError
    )
