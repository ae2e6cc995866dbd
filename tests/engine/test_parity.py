"""fp32 greedy generations equal transformers' generate(), architecture by architecture."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.engine.conftest import cpu_config, prompts_of
from tests.engine.reference import Reference, assert_matches

pytest.importorskip("transformers")

LENGTHS = [3, 17, 40, 9]
MAX_TOKENS = 12

CHECKPOINTS: dict[str, dict[str, Any]] = {
    "llama": {"arch": "llama"},
    "qwen2": {"arch": "qwen2"},  # q/k/v biases
    "qwen3": {"arch": "qwen3"},  # q/k norms
    "llama-tied-headdim": {"arch": "llama", "tie": True, "head_dim": 32},
    "llama3-rope": {
        "arch": "llama",
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
    },
    "qwen2-linear-rope-sharded": {
        "arch": "qwen2",
        "rope_scaling": {"rope_type": "linear", "factor": 2.0},
        "shard_size": "40KB",
    },
}


@pytest.mark.parametrize("name", list(CHECKPOINTS))
def test_greedy_generations_equal_transformers(name: str, make_ckpt: Callable[..., Path]) -> None:
    from tiny_engine import LLM

    path = make_ckpt(name, **CHECKPOINTS[name])
    if "shard_size" in CHECKPOINTS[name]:
        assert (path / "model.safetensors.index.json").is_file()
    prompts = prompts_of(LENGTHS)
    ours = LLM(path, config=cpu_config()).generate(prompts, max_tokens=MAX_TOKENS, ignore_eos=True)
    ref = Reference(path)
    for prompt, out in zip(prompts, ours):
        assert_matches(ref, prompt, out, ref.generate(prompt, MAX_TOKENS))


def test_compiled_model_gives_the_eager_tokens(llama: Path) -> None:
    """The CPU default (level 2: torch.compile with Inductor) changes no token."""
    from tiny_engine import LLM

    prompts = prompts_of(LENGTHS)
    compiled = LLM(llama, config=cpu_config(model={"enforce_eager": False}))
    assert compiled.stats["compilation_level"] == 2
    eager = LLM(llama, config=cpu_config())
    assert compiled.generate(prompts, max_tokens=8) == eager.generate(prompts, max_tokens=8)


def test_eos_ends_a_generation_and_is_included(
    make_ckpt: Callable[..., Path],
) -> None:
    from tiny_engine import LLM

    path = make_ckpt("llama")
    llm = LLM(path, config=cpu_config())
    prompt = prompts_of([10])[0]
    free = llm.generate([prompt], max_tokens=10, ignore_eos=True)[0]
    # Make the third generated token the end of sequence: generation stops there.
    llm.spec = type(llm.spec)(**{**llm.spec.__dict__, "eos_token_ids": (free[2],)})
    stopped = llm.generate([prompt], max_tokens=10)[0]
    assert stopped == free[: free.index(free[2]) + 1]


def test_packed_linears_keep_the_tokens(make_ckpt: Callable[..., Path]) -> None:
    """A checkpoint large enough that its CPU weights are packed for oneDNN, compiled
    as the CPU resolves it: still transformers' tokens."""
    from tiny_engine import LLM

    path = make_ckpt(
        "llama-packed", arch="llama", hidden=512, heads=8, kv_heads=4, vocab=1024, init_std=0.05
    )
    config = cpu_config()
    del config["model"]["enforce_eager"]
    llm = LLM(path, config=config)
    assert llm.stats["packed_linears"] == 2 * 4 + 1  # qkv, o, gate_up, down per layer; lm_head
    assert llm.stats["compilation_level"] == 2
    prompts = prompts_of(LENGTHS, vocab=1024)
    ours = llm.generate(prompts, max_tokens=MAX_TOKENS, ignore_eos=True)
    ref = Reference(path)
    for prompt, out in zip(prompts, ours):
        assert_matches(ref, prompt, out, ref.generate(prompt, MAX_TOKENS))
