"""Reduced-precision KV caches: next-token agreement with an fp32 cache, measured.

The model stays fp32; only the cache is stored as bfloat16 or fp8. Agreement is
teacher-forced: for every position of the fp32 cache's greedy continuations,
does the reduced cache pick the same next token from the same context? The
thresholds (docs/build-an-engine.md explains them) sit about ten points below
what the random tiny checkpoint measures, and far above what a broken
quantisation path gives (a wrong scale or format agrees on a few percent).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.engine.conftest import prompts_of

pytest.importorskip("transformers")

POSITIONS = 16
THRESHOLDS = {"bfloat16": 0.95, "fp8": 0.75, "fp8_e5m2": 0.6}


def _config(cache_dtype: str, calculate: bool = False) -> dict[str, Any]:
    return {
        "model": {"dtype": "float32", "enforce_eager": True},
        "cache": {
            "cache_dtype": cache_dtype,
            "calculate_kv_scales": calculate,
            "num_gpu_blocks_override": 1024,
        },
        "scheduler": {"max_num_seqs": 256},
    }


@pytest.fixture(scope="module")
def forced(llama: Path) -> tuple[list[list[int]], list[int]]:
    """Contexts along the fp32 cache's greedy continuations, and its next tokens."""
    from tiny_engine import LLM

    prompts = prompts_of([5, 9, 17, 23, 31, 40, 48, 60], seed=11)
    ref = LLM(llama, config=_config("auto"), platform="h100", device="cpu")
    outs = ref.generate(prompts, max_tokens=POSITIONS, ignore_eos=True)
    contexts = [p + o[:k] for p, o in zip(prompts, outs) for k in range(POSITIONS)]
    return contexts, [o[k] for o in outs for k in range(POSITIONS)]


@pytest.mark.parametrize(
    ("cache_dtype", "calculate"),
    [("bfloat16", False), ("fp8", False), ("fp8", True), ("fp8_e5m2", True)],
)
def test_reduced_precision_cache_agrees_with_fp32(
    llama: Path,
    forced: tuple[list[list[int]], list[int]],
    cache_dtype: str,
    calculate: bool,
    record_property: Callable[[str, Any], None],
) -> None:
    import torch
    from tiny_engine import LLM

    contexts, expected = forced
    llm = LLM(llama, config=_config(cache_dtype, calculate), platform="h100", device="cpu")
    layer = llm.model.attention_layers()[0]
    if cache_dtype.startswith("fp8"):
        assert layer.key_cache.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
    got = [o[0] for o in llm.generate(contexts, max_tokens=1, ignore_eos=True)]
    agreement = sum(a == b for a, b in zip(got, expected)) / len(expected)
    record_property(f"agreement_{cache_dtype}_{calculate}", agreement)
    print(f"{cache_dtype} calculate_kv_scales={calculate}: agreement {agreement:.3f}")
    assert agreement >= THRESHOLDS[cache_dtype]
    if calculate:
        assert float(layer.k_scale) != 1.0 and float(layer.v_scale) != 1.0
        assert not layer.calculate_scales
