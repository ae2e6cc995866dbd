"""The Triton attention kernel compiles for real GPU targets, on a machine without a GPU.

The CPU tests run the kernel in Triton's interpreter, which accepts programs
the GPU compiler rejects (a loop-carried variable that changes type, dot
shapes below 16, a bfloat16 tile the interpreter could not multiply). Here
each launch the backend plans for a batch is compiled to PTX/cubin (and
AMDGPU code) ahead of time, with the arguments specialised as a real launch
would specialise them (an int equal to 1 becomes a constant).
"""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
import torch

from tests.attention.helpers import make_batch

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="triton is not installed"
)


def compile_for(target: tuple[str, int | str, int], **batch_args: Any) -> Any:
    from triton import compile as triton_compile
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction, mangle_type

    from hwplug.attention import AttentionCall, _triton_unified

    window = batch_args.pop("window", None)
    tensor_scales = batch_args.pop("tensor_scales", False)
    batch = make_batch(**batch_args)
    scale: float | torch.Tensor = torch.tensor(0.5) if tensor_scales else 0.5
    call = AttentionCall(*batch.args(), k_scale=scale, v_scale=scale)
    launch = _triton_unified.plan_launch(
        call,
        torch.empty_like(batch.query),
        scale=0.1,
        sliding_window=window,
        interpret=False,
    )
    fn = JITFunction(_triton_unified._unified_attention_kernel)
    runtime = [name for name in fn.arg_names if name not in launch.constexprs]
    signature = {name: "constexpr" for name in launch.constexprs}
    constexprs = dict(launch.constexprs)
    for name, arg in zip(runtime, launch.args):
        kind = mangle_type(arg, specialize=True)
        signature[name] = kind
        if kind == "constexpr":
            constexprs[name] = arg
    source = ASTSource(fn=fn, signature=signature, constexprs=constexprs)
    return triton_compile(source, target=GPUTarget(*target), options={"enable_fp_fusion": True})


def has_backend(name: str) -> bool:
    return importlib.util.find_spec(f"triton.backends.{name}") is not None


CUDA_90 = ("cuda", 90, 32)
CASES = {
    "decode bf16 cache, GQA 8": dict(
        seq_lens=[33, 7],
        query_lens=[1, 1],
        num_heads=16,
        num_kv_heads=2,
        head_size=128,
        block_size=16,
        dtype=torch.bfloat16,
    ),
    "prefill fp16 fp8-e4m3fn, tall tiles": dict(
        seq_lens=[40, 40],
        query_lens=[40, 20],
        num_heads=4,
        num_kv_heads=4,
        head_size=80,
        block_size=1,
        dtype=torch.float16,
        cache_dtype=torch.float8_e4m3fn,
        tensor_scales=True,
    ),
    "fp32 queries, head 256, window, one sequence": dict(
        seq_lens=[9],
        query_lens=[3],
        num_heads=2,
        num_kv_heads=1,
        head_size=256,
        block_size=5,
        dtype=torch.float32,
        window=4,
    ),
    "bf16 queries over an fp8-e5m2 cache": dict(
        seq_lens=[20, 3, 12],
        query_lens=[1, 3, 2],
        num_heads=32,
        num_kv_heads=1,
        head_size=64,
        block_size=8,
        dtype=torch.bfloat16,
        cache_dtype=torch.float8_e5m2,
    ),
}


@pytest.mark.skipif(not has_backend("nvidia"), reason="triton's NVIDIA backend is missing")
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_kernel_compiles_for_hopper(case: dict[str, Any]) -> None:
    kernel = compile_for(CUDA_90, **case)
    assert kernel.asm["cubin"]


@pytest.mark.skipif(not has_backend("nvidia"), reason="triton's NVIDIA backend is missing")
def test_kernel_compiles_for_ampere_with_an_fnuz_cache() -> None:
    case = dict(CASES["decode bf16 cache, GQA 8"], cache_dtype=torch.float8_e4m3fnuz)
    assert compile_for(("cuda", 80, 32), **case).asm["cubin"]


@pytest.mark.skipif(not has_backend("amd"), reason="triton's AMD backend is missing")
def test_kernel_compiles_for_mi300() -> None:
    case = dict(CASES["decode bf16 cache, GQA 8"], cache_dtype=torch.float8_e4m3fnuz)
    try:
        kernel = compile_for(("hip", "gfx942", 64), **case)
    except (FileNotFoundError, RuntimeError) as exc:  # no ROCm linker on this machine
        if "lld" in str(exc) or "rocm" in str(exc).lower():
            pytest.skip(f"cannot link AMDGPU code here: {exc}")
        raise
    assert kernel.asm["hsaco"]
