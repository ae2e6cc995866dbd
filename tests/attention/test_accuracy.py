"""Both built-in backends against a float64 reference over generated batches.

The reference reads what the caches hold after the forward (dequantised), so
these tests pin the attention; that the forward wrote exactly what
``write_kv_cache`` writes is checked byte for byte alongside. The Triton
backend runs on CPU through Triton's interpreter, on small shapes (about
2.5 ms per program instance).
"""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hwplug.attention import AttentionBackend, TorchAttentionBackend, TritonAttentionBackend
from hwplug.kernels import FP8_FORMATS, write_kv_cache
from tests.attention.helpers import make_batch, reference_attention

FP8 = [torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2]
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 2e-2}


@dataclasses.dataclass
class Case:
    """One generated forward call."""

    seq_lens: list[int]
    query_lens: list[int]
    num_kv_heads: int
    group: int
    head_size: int
    block_size: int
    window: int | None
    dtype: torch.dtype
    cache_dtype: torch.dtype
    padding: int
    tensor_scales: bool
    seed: int


@st.composite
def sequences(draw: st.DrawFn, max_len: int, max_query: int) -> tuple[int, int]:
    """(context length after the step, query length): decode, chunked or full prefill."""
    kind = draw(st.sampled_from(["decode", "chunked", "prefill"]))
    if kind == "decode":
        return draw(st.integers(1, max_len)), 1
    if kind == "prefill":
        n = draw(st.integers(1, max_query))
        return n, n
    q = draw(st.integers(2, max_query))
    return draw(st.integers(q + 1, max(q + 1, max_len))), q


@st.composite
def cases(
    draw: st.DrawFn,
    *,
    head_sizes: list[int],
    max_seqs: int,
    max_len: int,
    max_query: int,
    max_kv_heads: int,
) -> Case:
    seqs = draw(st.lists(sequences(max_len, max_query), min_size=1, max_size=max_seqs))
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16, torch.float16]))
    cache_dtype = draw(st.sampled_from([dtype, dtype, torch.bfloat16, *FP8]))
    return Case(
        seq_lens=[s for s, _ in seqs],
        query_lens=[q for _, q in seqs],
        num_kv_heads=draw(st.integers(1, max_kv_heads)),
        group=draw(st.sampled_from([1, 2, 3, 4])),
        head_size=draw(st.sampled_from(head_sizes)),
        block_size=draw(st.sampled_from([1, 3, 4, 8, 16])),
        window=draw(st.one_of(st.none(), st.integers(1, max_len))),
        dtype=dtype,
        cache_dtype=cache_dtype,
        padding=draw(st.integers(0, 2)),
        tensor_scales=draw(st.booleans()),
        seed=draw(st.integers(0, 2**16)),
    )


def run_case(backend: type[AttentionBackend], case: Case) -> None:
    num_heads = case.num_kv_heads * case.group
    batch = make_batch(
        case.seq_lens,
        case.query_lens,
        num_heads=num_heads,
        num_kv_heads=case.num_kv_heads,
        head_size=case.head_size,
        block_size=case.block_size,
        dtype=case.dtype,
        cache_dtype=case.cache_dtype,
        padding=case.padding,
        seed=case.seed,
    )
    fp8 = case.cache_dtype in FP8_FORMATS
    k_scale: float | torch.Tensor = 0.02 if fp8 else 1.0
    v_scale: float | torch.Tensor = 0.03 if fp8 else 1.0
    if case.tensor_scales:
        k_scale = torch.tensor(k_scale, dtype=torch.float32)
        v_scale = torch.tensor(v_scale, dtype=torch.float32)
    scale = case.head_size**-0.5
    impl = backend(
        num_heads,
        case.head_size,
        case.num_kv_heads,
        scale,
        sliding_window=case.window,
        cache_dtype=case.cache_dtype,
    )
    expected_k, expected_v = batch.key_cache.clone(), batch.value_cache.clone()
    write_kv_cache(
        batch.key,
        batch.value,
        expected_k,
        expected_v,
        batch.metadata.slot_mapping,
        k_scale,
        v_scale,
        backend="torch",
    )

    out = impl.forward(*batch.args(), k_scale=k_scale, v_scale=v_scale)

    assert out.shape == batch.query.shape
    assert out.dtype == case.dtype
    assert torch.equal(batch.key_cache.view(torch.uint8), expected_k.view(torch.uint8))
    assert torch.equal(batch.value_cache.view(torch.uint8), expected_v.view(torch.uint8))
    want = reference_attention(
        batch.query,
        batch.key_cache,
        batch.value_cache,
        batch.metadata,
        scale=scale,
        sliding_window=case.window,
        k_scale=k_scale,
        v_scale=v_scale,
    )
    got = out[: want.shape[0]].to(torch.float64)
    error = (got - want).abs().max().item() if want.numel() else 0.0
    assert error <= TOLERANCE[case.dtype], f"max abs error {error:.3g} for {case}"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(head_sizes=[8, 24, 32, 40], max_seqs=5, max_len=70, max_query=20, max_kv_heads=3))
def test_torch_backend_matches_the_float64_reference(case: Case) -> None:
    run_case(TorchAttentionBackend, case)


@pytest.mark.usefixtures("interpret")
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(head_sizes=[32, 48, 64], max_seqs=3, max_len=40, max_query=8, max_kv_heads=2))
def test_triton_backend_matches_the_float64_reference(case: Case) -> None:
    run_case(TritonAttentionBackend, case)


@pytest.fixture(params=["torch", "triton"])
def backend(request: pytest.FixtureRequest) -> type[AttentionBackend]:
    """Each built-in backend; Triton through its interpreter."""
    if request.param == "triton":
        request.getfixturevalue("interpret")
        return TritonAttentionBackend
    return TorchAttentionBackend


FIXED = {
    "decode batch": ([9, 33, 17, 1], [1, 1, 1, 1]),
    "full prefill": ([12, 7], [12, 7]),
    "chunked prefill": ([30], [6]),
    "mixed": ([20, 5, 41], [1, 5, 4]),
}


@pytest.mark.parametrize("lengths", FIXED.values(), ids=FIXED.keys())
@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float8_e4m3fn], ids=str)
def test_each_kind_of_batch(
    backend: type[AttentionBackend],
    lengths: tuple[list[int], list[int]],
    cache_dtype: torch.dtype,
) -> None:
    seq_lens, query_lens = lengths
    case = Case(
        seq_lens=seq_lens,
        query_lens=query_lens,
        num_kv_heads=2,
        group=4,
        head_size=64,
        block_size=16,
        window=None,
        dtype=torch.bfloat16,
        cache_dtype=cache_dtype,
        padding=3,
        tensor_scales=True,
        seed=1,
    )
    run_case(backend, case)


def test_sliding_window_shorter_than_the_chunk(backend: type[AttentionBackend]) -> None:
    case = Case(
        seq_lens=[40, 23],
        query_lens=[12, 1],
        num_kv_heads=1,
        group=2,
        head_size=32,
        block_size=8,
        window=5,
        dtype=torch.float32,
        cache_dtype=torch.float32,
        padding=0,
        tensor_scales=False,
        seed=2,
    )
    run_case(backend, case)


def test_a_window_changes_the_result(backend: type[AttentionBackend]) -> None:
    batch = make_batch([30], [1], num_heads=2, num_kv_heads=1, head_size=32, block_size=4)
    outs = []
    for window in (None, 4):
        impl = backend(2, 32, 1, 32**-0.5, sliding_window=window)
        outs.append(impl.forward(*batch.args()))
    assert not torch.allclose(outs[0], outs[1])


def test_sequences_without_query_tokens_are_skipped(backend: type[AttentionBackend]) -> None:
    case = Case(
        seq_lens=[10, 6, 12],
        query_lens=[2, 0, 1],
        num_kv_heads=1,
        group=1,
        head_size=32,
        block_size=4,
        window=None,
        dtype=torch.float32,
        cache_dtype=torch.float32,
        padding=1,
        tensor_scales=False,
        seed=3,
    )
    run_case(backend, case)


def test_an_all_padding_batch_writes_nothing(backend: type[AttentionBackend]) -> None:
    batch = make_batch([4], [0], num_heads=2, num_kv_heads=2, head_size=32, block_size=4, padding=3)
    before = batch.key_cache.clone()
    impl = backend(2, 32, 2, 0.1)
    out = impl.forward(*batch.args())
    assert out.shape == (3, 2, 32)
    assert torch.equal(batch.key_cache, before)


def test_torch_backend_decodes_in_groups_of_bounded_size(monkeypatch: pytest.MonkeyPatch) -> None:
    from hwplug.attention import torch_backend

    # a one-byte budget: every decoding sequence in a group of its own
    monkeypatch.setattr(torch_backend, "_GATHER_BYTES", 1)
    case = Case(
        seq_lens=[9, 30, 1, 17, 30],
        query_lens=[1, 1, 1, 3, 1],
        num_kv_heads=2,
        group=2,
        head_size=32,
        block_size=4,
        window=7,
        dtype=torch.float32,
        cache_dtype=torch.float8_e5m2,
        padding=1,
        tensor_scales=True,
        seed=4,
    )
    run_case(TorchAttentionBackend, case)


def test_the_interpreter_runs_the_kernel_after_triton_was_imported_without_it() -> None:
    """triton.language's own jit helpers are frozen at import: the kernel must not need them."""
    import subprocess
    import sys
    import textwrap

    pytest.importorskip("triton")
    script = textwrap.dedent(
        """
        import os
        import triton, triton.language  # imported while TRITON_INTERPRET is unset
        os.environ["TRITON_INTERPRET"] = "1"
        import torch
        from hwplug.attention import TritonAttentionBackend
        from tests.attention.helpers import make_batch
        batch = make_batch([5, 9], [5, 1], num_heads=2, num_kv_heads=1, head_size=32,
                           block_size=4)
        out = TritonAttentionBackend(2, 32, 1, 0.2).forward(
            batch.query, batch.key, batch.value, batch.key_cache, batch.value_cache,
            batch.metadata)
        assert torch.isfinite(out).all()
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env
    )
    assert result.returncode == 0, result.stderr[-2000:]
