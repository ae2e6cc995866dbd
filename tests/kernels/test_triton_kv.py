"""The Triton kernels, run on CPU through Triton's interpreter, against the torch reference.

``TRITON_INTERPRET=1`` is set by the ``interpret`` fixture inside each test,
long after ``hwplug.kernels`` was imported: the kernels must pick the
interpreter at call time.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import hwplug.kernels
from hwplug.kernels import (
    CACHE_DTYPES,
    FP8_FORMATS,
    INPUT_DTYPES,
    compute_kv_scales,
    gather_kv_cache,
    select_backend,
    triton_unavailable_reason,
    write_kv_cache,
)
from tests.kernels.conftest import HAS_TRITON
from tests.kernels.helpers import assert_same_bytes, edge_values, nearest_even_oracle

FP8 = list(FP8_FORMATS)
SENTINEL = 3.0


def write_both(
    key: torch.Tensor,
    value: torch.Tensor,
    shape: tuple[int, int, int, int],
    cache_dtype: torch.dtype,
    slots: torch.Tensor,
    k_scale: float | torch.Tensor = 1.0,
    v_scale: float | torch.Tensor = 1.0,
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Write the same batch with both backends into sentinel-filled caches."""
    out = {}
    for backend in ("torch", "triton"):
        key_cache = torch.full(shape, SENTINEL).to(cache_dtype)
        value_cache = key_cache.clone()
        write_kv_cache(key, value, key_cache, value_cache, slots, k_scale, v_scale, backend=backend)
        out[backend] = (key_cache, value_cache)
    return out


@pytest.mark.usefixtures("interpret")
@pytest.mark.parametrize("cache_dtype", FP8, ids=str)
def test_triton_stores_the_same_bytes_as_torch_on_random_data(cache_dtype: torch.dtype) -> None:
    torch.manual_seed(10)
    tokens, heads, head_size = 20, 4, 32
    # magnitudes over ten decades reach the subnormal range and the top of the format
    mags = torch.logspace(-6, 4, tokens * heads * head_size).view(tokens, heads, head_size)
    key = torch.randn(tokens, heads, head_size) * mags[torch.randperm(tokens)]
    key = key.to(torch.bfloat16)
    value = torch.randn(tokens, heads, head_size) * 3
    k_scale, v_scale = compute_kv_scales(key, value, cache_dtype)
    slots = torch.randperm(32)[:tokens]
    slots[::7] = -1
    shape = (8, 4, heads, head_size)
    caches = write_both(key, value, shape, cache_dtype, slots, k_scale, v_scale)
    for ref, got in zip(caches["torch"], caches["triton"]):
        assert_same_bytes(got, ref)
        assert (got.float() == SENTINEL).sum() == (ref.float() == SENTINEL).sum()

    key_cache, value_cache = caches["torch"]
    # one output dtype per format keeps the interpreter's bill small; all are covered
    dtype = INPUT_DTYPES[FP8.index(cache_dtype) % len(INPUT_DTYPES)]
    ref_k, ref_v = gather_kv_cache(
        key_cache, value_cache, slots, k_scale, v_scale, dtype=dtype, backend="torch"
    )
    got_k, got_v = gather_kv_cache(
        key_cache, value_cache, slots, k_scale, v_scale, dtype=dtype, backend="triton"
    )
    assert_same_bytes(got_k, ref_k)
    assert_same_bytes(got_v, ref_v)
    assert (got_k[slots < 0] == 0).all()


@pytest.mark.usefixtures("interpret")
@pytest.mark.parametrize("cache_dtype", FP8, ids=str)
def test_triton_rounds_edge_values_exactly(cache_dtype: torch.dtype) -> None:
    """Ties, neighbours of ties, subnormals, overflow, infinities and signed zeros:
    the cases the interpreter's own fp8 cast gets wrong."""
    values = edge_values(cache_dtype)
    values = torch.cat([values, torch.zeros((-values.numel()) % 256)])
    rows = values.numel() // 256
    key = values.view(rows, 4, 64)
    caches = write_both(key, key, (rows, 1, 4, 64), cache_dtype, torch.arange(rows))
    oracle = nearest_even_oracle(values, cache_dtype)
    assert_same_bytes(caches["triton"][0].view(-1), oracle, 1.0)
    assert_same_bytes(caches["torch"][0].view(-1), oracle, 1.0)


@pytest.mark.usefixtures("interpret")
def test_triton_keeps_nan_as_nan() -> None:
    key = torch.tensor([float("nan"), -float("nan"), 1.0]).view(1, 1, 3)
    for cache_dtype in CACHE_DTYPES:
        caches = write_both(key, key, (1, 1, 1, 3), cache_dtype, torch.tensor([0]))
        stored = caches["triton"][0].view(-1).float()
        assert stored[:2].isnan().all()
        assert stored[2] == 1.0
        got, _ = gather_kv_cache(*caches["triton"], torch.tensor([0]), dtype=torch.float32)
        assert got.view(-1)[:2].isnan().all()


@pytest.mark.usefixtures("interpret")
@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_triton_non_fp8_caches_match_torch(cache_dtype: torch.dtype) -> None:
    torch.manual_seed(11)
    # include fp32 subnormals and values beyond the fp16 range
    key = torch.randn(12, 2, 8) * torch.logspace(-42, 6, 12).view(12, 1, 1)
    value = torch.randn(12, 2, 8, dtype=torch.float16)
    slots = torch.tensor([3, 2, 1, 0, -1, 15, 14, 13, -2, 8, 9, 10])
    caches = write_both(key, value, (4, 4, 2, 8), cache_dtype, slots, 2.0, 0.5)
    for ref, got in zip(caches["torch"], caches["triton"]):
        assert_same_bytes(got, ref, 1.0)
    # each cache dtype is read back as a different dtype, so every pair is covered
    dtype = {torch.bfloat16: torch.float16, torch.float16: torch.float32}.get(
        cache_dtype, torch.bfloat16
    )
    ref = gather_kv_cache(*caches["torch"], slots, dtype=dtype, backend="torch")
    got = gather_kv_cache(*caches["torch"], slots, dtype=dtype, backend="triton")
    assert_same_bytes(got[0], ref[0], 1.0)
    assert_same_bytes(got[1], ref[1], 1.0)


@pytest.mark.usefixtures("interpret")
def test_triton_handles_strided_inputs_and_caches() -> None:
    torch.manual_seed(12)
    qkv = torch.randn(6, 3, 2, 8, dtype=torch.float16)
    key, value = qkv[:, 1], qkv[:, 2]
    slots = torch.tensor([7, 0, 3, -1, 4, 6])
    results = []
    for backend in ("torch", "triton"):
        combined = torch.zeros(4, 2, 2, 2, 8, dtype=torch.float8_e4m3fn)
        write_kv_cache(key, value, combined[:, 0], combined[:, 1], slots, backend=backend)
        results.append(combined)
    assert_same_bytes(results[1], results[0], 1.0)


@st.composite
def batches(draw: st.DrawFn) -> dict[str, object]:
    block_size = draw(st.integers(1, 4))
    num_blocks = draw(st.integers(1, 4))
    num_slots = num_blocks * block_size
    used = draw(st.lists(st.integers(0, num_slots - 1), unique=True, max_size=min(num_slots, 10)))
    padding = draw(st.lists(st.integers(-9, -1), max_size=2))
    return {
        "shape": (num_blocks, block_size, draw(st.integers(1, 3)), draw(st.integers(1, 12))),
        "slots": torch.tensor(draw(st.permutations(used + padding)), dtype=torch.int64),
        "cache_dtype": draw(st.sampled_from(CACHE_DTYPES)),
        "input_dtype": draw(st.sampled_from(INPUT_DTYPES)),
        "seed": draw(st.integers(0, 2**16)),
    }


@pytest.mark.usefixtures("interpret")
@settings(max_examples=8, deadline=None)
@given(batch=batches())
def test_triton_matches_torch_on_any_layout(batch: dict) -> None:
    _, _, heads, head_size = batch["shape"]
    slots: torch.Tensor = batch["slots"]
    gen = torch.Generator().manual_seed(batch["seed"])
    key = (torch.randn(len(slots), heads, head_size, generator=gen) * 50).to(batch["input_dtype"])
    value = torch.randn(len(slots), heads, head_size, generator=gen).to(batch["input_dtype"])
    caches = write_both(key, value, batch["shape"], batch["cache_dtype"], slots, 0.5, 2.0)
    for ref, got in zip(caches["torch"], caches["triton"]):
        assert_same_bytes(got, ref)
    ref_k, _ = gather_kv_cache(*caches["torch"], slots, 0.5, 2.0, dtype=torch.float32)
    got_k, _ = gather_kv_cache(
        *caches["torch"], slots, 0.5, 2.0, dtype=torch.float32, backend="triton"
    )
    assert_same_bytes(got_k, ref_k)


# -- backend selection ------------------------------------------------------------


def test_interpreter_is_chosen_at_call_time(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("triton")
    pytest.importorskip("numpy")
    from hwplug.kernels import _triton_kv

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert select_backend("auto", "cpu") == "torch"
    # set only now, long after hwplug.kernels (and its kernel module) were imported
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert select_backend("auto", "cpu") == "triton"
    key = torch.ones(2, 1, 4)
    key_cache = torch.zeros(1, 2, 1, 4, dtype=torch.float8_e4m3fn)
    value_cache = key_cache.clone()
    write_kv_cache(key, key, key_cache, value_cache, torch.tensor([1, 0]), backend="triton")
    assert (key_cache.float() == 1.0).all()
    assert (_triton_kv._copy_rows_kernel.__name__, True) in _triton_kv._KERNELS
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert select_backend("auto", "cpu") == "torch"


@pytest.mark.usefixtures("no_interpret")
def test_triton_backend_on_cpu_without_interpreter_is_a_runtime_error() -> None:
    key = torch.ones(1, 1, 4)
    key_cache = torch.zeros(1, 1, 1, 4)
    with pytest.raises(RuntimeError, match=r"backend='triton' cannot run here.*TRITON_INTERPRET=1"):
        write_kv_cache(key, key, key_cache, key_cache.clone(), torch.tensor([0]), backend="triton")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        gather_kv_cache(
            key_cache, key_cache, torch.tensor([0]), dtype=torch.float32, backend="triton"
        )
    # "auto" falls back to the reference instead
    write_kv_cache(key, key, key_cache, key_cache.clone(), torch.tensor([0]), backend="auto")
    assert (key_cache == 1).all()


def test_triton_reason_for_devices_it_cannot_run_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert "do not run on meta tensors" in (triton_unavailable_reason("meta") or "")
    with pytest.raises(RuntimeError, match="not run on meta tensors"):
        select_backend("triton", "meta")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert "interpreter" in (triton_unavailable_reason("meta") or "")
    assert select_backend("auto", "meta") == "torch"


def test_package_imports_and_falls_back_without_triton() -> None:
    script = textwrap.dedent(
        """
        import os, sys
        sys.modules["triton"] = None  # make `import triton` fail
        os.environ["TRITON_INTERPRET"] = "1"
        import torch
        import hwplug.kernels as k
        assert "triton" not in [m for m in sys.modules if sys.modules[m] is not None]
        assert k.select_backend("auto", "cpu") == "torch"
        cache = torch.zeros(1, 1, 1, 2)
        k.write_kv_cache(torch.ones(1, 1, 2), torch.ones(1, 1, 2), cache, cache.clone(),
                         torch.tensor([0]))
        assert (cache == 1).all()
        try:
            k.select_backend("triton", "cpu")
        except RuntimeError as exc:
            print(exc)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "the triton package is not installed" in result.stdout


def test_kernels_were_imported_before_any_interpreter_setting() -> None:
    # documents the premise of the tests above: the package is imported at collection
    assert hwplug.kernels.__name__ in sys.modules


# -- the compiled form ------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "src", "dst", "write"),
    [
        (("cuda", 90, 32), ("*i16", 2), ("*u8", 3), True),  # bf16 -> fp8
        (("cuda", 80, 32), ("*u8", 3), ("*i16", 2), False),  # fp8 -> bf16
        (("hip", "gfx942", 64), ("*fp32", 0), ("*u8", 3), True),  # fp32 -> fp8 (fnuz)
        (("cuda", 90, 32), ("*fp16", 1), ("*fp32", 0), False),  # fp16 -> fp32
    ],
    ids=["cuda-write-fp8", "cuda-gather-fp8", "rocm-write-fp8", "cuda-gather-fp16"],
)
def test_kernel_compiles_for_gpu_targets(
    target: tuple[str, object, int], src: tuple[str, int], dst: tuple[str, int], write: bool
) -> None:
    """The interpreter accepts more than the compiler: compile ahead of time, no GPU needed."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from hwplug.kernels import _triton_kv

    kernel = _triton_kv.kernel_for(interpret=False)
    fnuz = target[0] == "hip"
    consts = {
        "SRC_PAGED": not write,
        "DST_PAGED": write,
        "SRC_KIND": src[1],
        "DST_KIND": dst[1],
        "SCALE_OP": 1 if write else 2,
        "MANT": 3,
        "BIAS": 8 if fnuz else 7,
        "FLAVOR": 2 if fnuz else 0,
        "MAX_VAL": 240.0 if fnuz else 448.0,
        "SUB_STEP": 2.0**-10 if fnuz else 2.0**-9,
        "HEAD_SIZE": 128,
        "BLOCK": 1024,
    }
    signature = {"src_ptr": src[0], "dst_ptr": dst[0], "slot_ptr": "*i64", "scale": "fp32"}
    for name in kernel.arg_names:
        signature.setdefault(name, "constexpr" if name in consts else "i32")
    source = ASTSource(
        kernel,
        signature,
        constexprs={(kernel.arg_names.index(k),): v for k, v in consts.items()},
    )
    try:
        compiled = triton.compile(
            source, target=GPUTarget(*target), options={"enable_fp_fusion": False}
        )
    except (ImportError, KeyError, RuntimeError) as exc:
        if "backend" in str(exc).lower() or "ptxas" in str(exc).lower():
            pytest.skip(f"this triton build cannot compile for {target[0]}: {exc}")
        raise
    assert compiled.asm


def test_the_caller_says_whether_its_platform_runs_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernels look up no platform: the caller passes its platform's ``runs_triton``;
    without it, the device type decides (Triton serves cuda and xpu devices)."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    refused = triton_unavailable_reason("meta", runs_triton=False)
    assert "the platform of meta tensors does not run Triton" in (refused or "")
    assert "Triton has no backend for meta devices" in (triton_unavailable_reason("meta") or "")
    assert select_backend("auto", "meta", runs_triton=False) == "torch"
    with pytest.raises(RuntimeError, match="does not run Triton"):
        select_backend("triton", "meta", runs_triton=False)
    if HAS_TRITON:
        assert triton_unavailable_reason("meta", runs_triton=True) is None
        assert triton_unavailable_reason("cuda") is None  # by device type; nothing initialised
