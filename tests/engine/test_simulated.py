"""A simulated H100's whole resolved flow, run on CPU tensors.

Piecewise compilation through hwplug's backend, the platform's CUDA-graph
wrapper with a CPU graph backend, the GraphDispatcher's padded keys, and the
Triton attention under the interpreter: the tokens are transformers' own.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.engine.conftest import cpu_config, prompts_of
from tests.engine.reference import Reference, assert_matches

pytest.importorskip("transformers")
pytest.importorskip("triton")


@pytest.fixture(scope="module")
def small(make_ckpt: Callable[..., Path]) -> Path:
    # head size 32: the smallest the Triton kernel takes
    return make_ckpt("small-h32", arch="llama", layers=1, heads=2, kv_heads=1)


def test_simulated_h100_runs_graphs_and_triton_on_cpu(
    small: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tiny_engine import LLM

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    config = {
        "model": {"dtype": "float32", "max_model_len": 64},
        "cache": {"num_gpu_blocks_override": 16},
        "scheduler": {"max_num_seqs": 2, "max_num_batched_tokens": 32, "cuda_graph_sizes": [2]},
        "compilation": {"use_inductor": False},
    }
    llm = LLM(small, config=config, platform="h100", device="cpu")
    stats = llm.stats
    assert (stats["platform"], stats["profile"], stats["device"]) == ("cuda", "h100", "cpu")
    assert stats["compilation_level"] == 3
    assert stats["cudagraph_mode"] == "FULL_AND_PIECEWISE"
    if hasattr(llm.config, "attention"):
        assert stats["attention_backend"] == "triton"
    backend = llm.runner.graph_backend
    assert backend is not None and stats["graphs_captured"] == len(backend.captures) > 0

    prompts = prompts_of([3, 7, 5])
    out = llm.generate(prompts, max_tokens=3, ignore_eos=True)
    assert backend.replays, "no step replayed a captured graph"
    ref = Reference(small)
    for prompt, ours in zip(prompts, out):
        assert_matches(ref, prompt, ours, ref.generate(prompt, 3))


def test_simulated_platform_needs_a_device(small: Path) -> None:
    from tiny_engine import LLM

    from hwplug import ConfigError

    with pytest.raises(ConfigError, match="device='cpu'"):
        LLM(small, config=cpu_config(), platform="h100")
