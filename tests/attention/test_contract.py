"""The AttentionBackend contract: what problem() refuses, and argument errors."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import hwplug
from hwplug.attention import (
    AttentionBackend,
    AttentionMetadata,
    TorchAttentionBackend,
    TritonAttentionBackend,
)
from hwplug.attention.base import describe_sizes
from hwplug.core.config import CacheConfig, EngineConfig, ModelConfig
from hwplug.core.graphs import AttentionGraphSupport
from hwplug.core.platform import Platform
from tests.attention.helpers import make_batch


@pytest.fixture
def h100() -> Iterator[Platform]:
    with hwplug.use_platform("h100") as platform:
        yield platform


def config(**model: Any) -> EngineConfig:
    cache = model.pop("cache", {})
    return EngineConfig(model=ModelConfig(**model), cache=CacheConfig(**cache))


class Narrow(AttentionBackend):
    """A backend that restricts everything, to see each refusal."""

    name = "narrow"
    graph_support = AttentionGraphSupport.UNIFORM_BATCH
    head_sizes = (64, 128)
    model_dtypes = ("bfloat16",)
    cache_dtypes = ("auto", "fp8_e4m3")
    block_sizes = (16, 32)
    supports_sliding_window = False


# -- problem() -------------------------------------------------------------------


@pytest.mark.parametrize("profile", ["h100", "a100", "mi300x", "max-1550"])
def test_triton_serves_the_default_model_on_gpus(profile: str) -> None:
    with hwplug.use_platform(profile) as platform:
        assert TritonAttentionBackend.problem(EngineConfig(), platform) is None


@pytest.mark.parametrize("profile", ["cpu-generic", "gaudi2", "h100", "mi300x"])
def test_torch_serves_every_device(profile: str) -> None:
    with hwplug.use_platform(profile) as platform:
        assert TorchAttentionBackend.problem(config(sliding_window=128), platform) is None


@pytest.mark.parametrize(("profile", "kind"), [("cpu-generic", "cpu"), ("gaudi2", "hpu")])
def test_triton_refuses_other_device_types(profile: str, kind: str) -> None:
    with hwplug.use_platform(profile) as platform:
        problem = TritonAttentionBackend.problem(EngineConfig(), platform)
    assert problem is not None
    assert "the triton attention backend runs Triton kernels" in problem
    assert f"a {kind} device) does not run Triton" in problem
    assert platform.describe_device() in problem


@pytest.mark.parametrize("head_size", [24, 72, 272, 8])
def test_triton_refuses_head_sizes_off_its_grid(h100: Platform, head_size: int) -> None:
    problem = TritonAttentionBackend.problem(config(head_size=head_size), h100)
    assert problem == (
        f"model.head_size={head_size} is not served by the triton attention backend; it "
        "serves every multiple of 16 from 32 to 256"
    )


@pytest.mark.parametrize("head_size", [32, 80, 96, 112, 256])
def test_triton_serves_every_multiple_of_16_in_range(h100: Platform, head_size: int) -> None:
    assert TritonAttentionBackend.problem(config(head_size=head_size), h100) is None


@pytest.mark.parametrize("backend", [TorchAttentionBackend, TritonAttentionBackend])
def test_mla_models_are_refused(h100: Platform, backend: type[AttentionBackend]) -> None:
    problem = backend.problem(config(use_mla=True), h100)
    assert problem is not None
    assert problem.startswith("model.use_mla=True:")
    assert f"the {backend.name} attention backend does not serve" in problem


def test_triton_refuses_the_gaudi_cache_format(h100: Platform) -> None:
    problem = TritonAttentionBackend.problem(config(cache={"cache_dtype": "fp8_inc"}), h100)
    assert problem is not None
    assert problem.startswith("cache.cache_dtype='fp8_inc' is not read by")
    assert "auto, bfloat16, fp8, fp8_e4m3, fp8_e5m2" in problem


@pytest.mark.parametrize("cache_dtype", ["auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2"])
def test_triton_reads_every_gpu_cache_dtype(h100: Platform, cache_dtype: str) -> None:
    assert TritonAttentionBackend.problem(config(cache={"cache_dtype": cache_dtype}), h100) is None


def test_model_dtype_refusal_names_the_field_and_the_choices(h100: Platform) -> None:
    problem = Narrow.problem(config(dtype="float16", head_size=64), h100)
    assert problem == (
        "model.dtype='float16' is not served by the narrow attention backend; it serves bfloat16"
    )


def test_auto_model_dtype_is_judged_as_the_platform_s_first_choice(h100: Platform) -> None:
    assert h100.supported_model_dtypes()[0] == "bfloat16"
    assert Narrow.problem(config(dtype="auto", head_size=64), h100) is None


def test_cache_dtype_refusal(h100: Platform) -> None:
    problem = Narrow.problem(config(head_size=64, cache={"cache_dtype": "fp8_e5m2"}), h100)
    assert problem == (
        "cache.cache_dtype='fp8_e5m2' is not read by the narrow attention backend; it reads "
        "auto, fp8_e4m3"
    )


def test_block_size_refusal(h100: Platform) -> None:
    problem = Narrow.problem(config(head_size=64, cache={"block_size": 8}), h100)
    assert problem == (
        "cache.block_size=8 is not served by the narrow attention backend; it serves 16, 32"
    )


def test_an_unset_block_size_is_not_refused(h100: Platform) -> None:
    assert Narrow.problem(config(head_size=64, cache={"block_size": None}), h100) is None


def test_sliding_window_refusal(h100: Platform) -> None:
    problem = Narrow.problem(config(head_size=64, sliding_window=4096), h100)
    assert problem == (
        "model.sliding_window=4096: the narrow attention backend does not serve "
        "sliding-window attention; it needs model.sliding_window=None"
    )


def test_head_size_refusal_lists_a_tuple(h100: Platform) -> None:
    problem = Narrow.problem(config(head_size=96), h100)
    assert problem is not None
    assert problem.endswith("it serves 64, 128")


def test_the_first_problem_is_reported(h100: Platform) -> None:
    # MLA comes first: it is the most fundamental mismatch
    problem = Narrow.problem(config(use_mla=True, head_size=96, dtype="float32"), h100)
    assert problem is not None
    assert problem.startswith("model.use_mla=True")


def test_describe_sizes() -> None:
    assert describe_sizes(range(32, 257, 16)) == "every multiple of 16 from 32 to 256"
    assert describe_sizes(range(1, 9)) == "every size from 1 to 8"
    assert describe_sizes((32, 8, 16)) == "8, 16, 32"


def test_built_in_identities() -> None:
    assert TorchAttentionBackend.name == "torch"
    assert TorchAttentionBackend.graph_support is AttentionGraphSupport.NEVER
    assert TritonAttentionBackend.name == "triton"
    assert TritonAttentionBackend.graph_support is AttentionGraphSupport.ALWAYS


# -- construction ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((0, 64, 1, 0.1), {}, "num_heads must be a positive integer; got 0"),
        ((8.0, 64, 1, 0.1), {}, "num_heads must be a positive integer; got 8.0"),
        ((8, True, 1, 0.1), {}, "head_size must be a positive integer; got True"),
        ((8, 64, -2, 0.1), {}, "num_kv_heads must be a positive integer; got -2"),
        ((8, 64, 3, 0.1), {}, r"num_heads \(8\) must be a multiple of num_kv_heads \(3\)"),
        ((8, 64, 2, 0.0), {}, "scale must be a positive finite number; got 0.0"),
        ((8, 64, 2, float("nan")), {}, "scale must be a positive finite number; got nan"),
        ((8, 64, 2, "0.1"), {}, "scale must be a positive finite number; got '0.1'"),
        ((8, 64, 2, 0.1), {"sliding_window": 0}, "sliding_window must be a positive integer"),
        ((8, 64, 2, 0.1), {"cache_dtype": "int8"}, "cache_dtype='int8' is not a cache dtype"),
        ((8, 64, 2, 0.1), {"cache_dtype": torch.int8}, "cache_dtype=torch.int8 is not a KV"),
        ((8, 64, 2, 0.1), {"cache_dtype": "fp8"}, "'fp8' depends on the platform"),
    ],
)
def test_constructor_rejects_bad_arguments(
    args: tuple[Any, ...], kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        TorchAttentionBackend(*args, **kwargs)


def test_triton_constructor_rejects_head_sizes_it_cannot_serve() -> None:
    with pytest.raises(ValueError, match="head_size=40 is not served by the triton"):
        TritonAttentionBackend(4, 40, 4, 0.1)


@pytest.mark.parametrize(
    ("given", "dtype"),
    [
        ("auto", None),
        ("bfloat16", torch.bfloat16),
        ("float16", torch.float16),
        ("float32", torch.float32),
        ("fp8_e4m3", torch.float8_e4m3fn),
        ("fp8_e5m2", torch.float8_e5m2),
        (torch.float8_e4m3fnuz, torch.float8_e4m3fnuz),
    ],
)
def test_cache_dtype_spellings(given: str | torch.dtype, dtype: torch.dtype | None) -> None:
    assert TorchAttentionBackend(4, 32, 2, 0.1, cache_dtype=given).cache_dtype == dtype


def test_repr_shows_the_layout() -> None:
    impl = TritonAttentionBackend(8, 64, 2, 0.125, sliding_window=16, cache_dtype="fp8_e4m3")
    assert repr(impl) == (
        "TritonAttentionBackend(num_heads=8, head_size=64, num_kv_heads=2, scale=0.125, "
        "sliding_window=16, cache_dtype=float8_e4m3fn)"
    )


# -- forward arguments -------------------------------------------------------------------


def good() -> dict[str, Any]:
    batch = make_batch([6, 3], [2, 1], num_heads=4, num_kv_heads=2, head_size=32, block_size=4)
    return {
        "query": batch.query,
        "key": batch.key,
        "value": batch.value,
        "key_cache": batch.key_cache,
        "value_cache": batch.value_cache,
        "metadata": batch.metadata,
    }


def call(args: dict[str, Any], **scales: Any) -> torch.Tensor:
    impl = TorchAttentionBackend(4, 32, 2, 0.1)
    return impl.forward(**args, **scales)


def with_metadata(**fields: Any) -> dict[str, Any]:
    args = good()
    meta = args["metadata"]
    args["metadata"] = AttentionMetadata(
        **{
            "query_start_loc": meta.query_start_loc,
            "seq_lens": meta.seq_lens,
            "block_table": meta.block_table,
            "slot_mapping": meta.slot_mapping,
            **fields,
        }
    )
    return args


BAD_FORWARD = {
    "query not a tensor": (
        lambda a: {**a, "query": [1.0]},
        re.escape(
            "query must be a torch.Tensor of shape [num_tokens, num_heads, head_size]; got list"
        ),
    ),
    "query heads": (
        lambda a: {**a, "query": a["query"][:, :2]},
        re.escape("query must have shape [num_tokens, num_heads, head_size] = [*, 4, 32]"),
    ),
    "key rows": (
        lambda a: {**a, "key": a["key"][:1]},
        re.escape("key must have shape [num_tokens, num_kv_heads, head_size] = [3, 2, 32]"),
    ),
    "query dtype": (
        lambda a: {**a, "query": a["query"].double()},
        "query dtype must be one of bfloat16, float16, float32; got float64",
    ),
    "value dtype": (
        lambda a: {**a, "value": a["value"].half()},
        r"value dtype must equal the query's \(float32\); got float16",
    ),
    "cache shape": (
        lambda a: {**a, "value_cache": a["value_cache"][:1]},
        "value_cache must have shape",
    ),
    "cache dtype": (
        lambda a: {**a, "key_cache": a["key_cache"].bfloat16()},
        r"key_cache dtype must be float32, the query's dtype \(cache_dtype='auto'\); got bfloat16",
    ),
    "shared cache": (
        lambda a: {**a, "value_cache": a["key_cache"]},
        "key_cache and value_cache share memory",
    ),
    "metadata type": (
        lambda a: {**a, "metadata": {"seq_lens": 1}},
        "metadata must be an AttentionMetadata or what prepare\\(\\) returned; got dict",
    ),
}


@pytest.mark.parametrize("change", BAD_FORWARD.values(), ids=BAD_FORWARD.keys())
def test_forward_rejects_bad_arguments(change: tuple[Any, str]) -> None:
    edit, message = change
    with pytest.raises(ValueError, match=message):
        call(edit(good()))


@pytest.mark.parametrize("change", BAD_FORWARD.values(), ids=BAD_FORWARD.keys())
def test_a_backend_that_accepted_good_arguments_still_rejects_bad_ones(
    change: tuple[Any, str],
) -> None:
    """Layouts already checked are not checked again; any other layout still is."""
    edit, message = change
    impl = TorchAttentionBackend(4, 32, 2, 0.1)
    args = good()
    for _ in range(2):
        impl.forward(**args)
    with pytest.raises(ValueError, match=message):
        impl.forward(**edit(args))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"query_start_loc": torch.tensor([0, 2, 3])},
            "AttentionMetadata.query_start_loc must be int32; got int64",
        ),
        (
            {"slot_mapping": torch.tensor([0, 1, 2, 3], dtype=torch.int64)},
            r"slot_mapping must have one slot per query row \(3\); got 4",
        ),
        (
            {"block_table": torch.zeros(3, 2, dtype=torch.int32)},
            r"block_table must have one row per sequence \(2\); got 3 rows",
        ),
        (
            {"seq_lens": torch.zeros(2, 1, dtype=torch.int32)},
            re.escape("AttentionMetadata.seq_lens must have shape [num_seqs]; got [2, 1]"),
        ),
        (
            {"query_start_loc": torch.tensor([0, 3], dtype=torch.int32)},
            r"query_start_loc must have num_seqs \+ 1 = 3 entries",
        ),
        (
            {"seq_lens": torch.zeros(2, dtype=torch.int32, device="meta")},
            "AttentionMetadata tensors must be on one device",
        ),
    ],
)
def test_forward_rejects_bad_metadata(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call(with_metadata(**fields))


def test_metadata_checked_for_one_layer_is_checked_again_for_other_rows_or_other_metadata() -> None:
    """A step's layers share its metadata, checked once; the same metadata with a query of
    other rows, or other metadata, is checked afresh."""
    impl = TorchAttentionBackend(4, 32, 2, 0.1)
    args = good()
    impl.forward(**args)
    short = {**args, **{name: args[name][:2] for name in ("query", "key", "value")}}
    with pytest.raises(ValueError, match=r"one slot per query row \(2\); got 3"):
        impl.forward(**short)
    bad = with_metadata(slot_mapping=torch.tensor([0, 1, 2, 3], dtype=torch.int64))
    with pytest.raises(ValueError, match=r"one slot per query row \(3\); got 4"):
        impl.forward(**{**args, "metadata": bad["metadata"]})


def test_metadata_on_another_device_is_rejected() -> None:
    args = good()
    args["metadata"] = args["metadata"].to("meta")
    with pytest.raises(ValueError, match="all tensors must be on one device; .*metadata on meta"):
        call(args)


@pytest.mark.parametrize(
    ("scale", "message"),
    [
        (-1.0, "k_scale must be a positive finite float or a 0-d float32 tensor; got -1.0"),
        (float("inf"), "k_scale must be a positive finite float"),
        ("1", "k_scale must be a positive finite float"),
        (torch.tensor(1.0, dtype=torch.float64), "k_scale must be a float or a 0-d float32"),
        (torch.ones(2), re.escape("tensor of shape [2]")),
        (torch.tensor(1.0, device="meta"), "k_scale must be on the query's device"),
    ],
)
def test_forward_rejects_bad_scales(scale: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call(good(), k_scale=scale)


def test_torch_backend_checks_values_it_reads() -> None:
    args = with_metadata(seq_lens=torch.tensor([1, 3], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"sequence 0 has query_lens\[0\]=2 and seq_lens\[0\]=1"):
        call(args)
    args = with_metadata(block_table=torch.tensor([[0, 99], [2, 0]], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"block_table\[0, 1\] = 99, but the cache has"):
        call(args)
    args = with_metadata(slot_mapping=torch.tensor([0, 1, 500]))
    with pytest.raises(ValueError, match="slot_mapping holds slot 500, but the cache has"):
        call(args)


@pytest.mark.usefixtures("no_interpret")
def test_triton_on_cpu_without_the_interpreter_says_how_to_run_it() -> None:
    impl = TritonAttentionBackend(4, 32, 2, 0.1)
    with pytest.raises(RuntimeError, match=r"cannot run here: .*set TRITON_INTERPRET=1"):
        impl.forward(**good())


def test_the_base_class_has_no_implementation() -> None:
    class Empty(AttentionBackend):
        name = "empty"

    with pytest.raises(NotImplementedError, match="Empty must implement attend"):
        Empty(4, 32, 2, 0.1).forward(**good())
