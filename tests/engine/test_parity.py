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


def _update_weights(engine: Any, how: str) -> None:
    import torch

    layer = engine.model.layers[0]
    down, qkv = layer.mlp.down_proj.weight, layer.self_attn.qkv_proj.weight
    if how == "load_state_dict":
        state = engine.model.state_dict()
        state["layers.0.mlp.down_proj.weight"] = down * -3.0
        engine.model.load_state_dict(state)
        return
    context = torch.inference_mode() if how.endswith("inference_mode") else torch.no_grad()
    with context:
        if how.startswith("data"):
            down.data.mul_(-3.0)
            qkv.data.copy_(qkv.flip(0))
        else:
            down.mul_(-3.0)
            qkv.copy_(qkv.flip(0))


@pytest.mark.parametrize("eager", [True, False], ids=["eager", "compiled"])
@pytest.mark.parametrize(
    "how", ["in_place/no_grad", "in_place/inference_mode", "load_state_dict", "data/no_grad"]
)
def test_a_weight_update_is_seen_on_the_next_call(llama: Path, eager: bool, how: str) -> None:
    """The engine computes from the weights themselves (no packed or converted copy), so
    an update changes the next call's tokens exactly as a fresh engine with those
    weights gives them (SPEC 13). Prefix blocks computed with the old weights are
    dropped when a parameter's version changes; writes through ``.data`` bump none,
    so after those the caller resets the prefix cache."""
    from tiny_engine import LLM

    config = cpu_config()
    if not eager:
        del config["model"]["enforce_eager"]
    prompts = prompts_of([5, 20, 40])
    llm = LLM(llama, config=config)
    before = llm.generate(prompts, max_tokens=8, ignore_eos=True)
    state_keys = set(llm.model.state_dict())
    fresh = LLM(llama, config=config)
    for engine in (llm, fresh):
        _update_weights(engine, how)
    if how.startswith("data"):
        assert llm.reset_prefix_cache() > 0
    hits = llm.stats["prefix_cache_hits"]
    after = llm.generate(prompts, max_tokens=8, ignore_eos=True)
    assert after != before
    assert after == fresh.generate(prompts, max_tokens=8, ignore_eos=True)
    assert llm.stats["prefix_cache_hits"] == hits, "a block of the old weights was reused"
    assert set(llm.model.state_dict()) == state_keys


def test_loading_adds_no_second_copy_of_the_weights(llama: Path) -> None:
    """Every weight tensor the model holds is one of its parameters: no packed or
    converted copy is kept beside them."""
    from tiny_engine import LLM

    llm = LLM(llama, config=cpu_config())
    params = {p.data_ptr() for p in llm.model.parameters()}
    weight_bytes = sum(p.numel() * p.element_size() for p in llm.model.parameters())
    tensors = [t for t in llm.model.state_dict(keep_vars=True).values()]
    assert {t.data_ptr() for t in tensors} <= params
    assert sum(t.numel() * t.element_size() for t in {id(t): t for t in tensors}.values()) <= (
        weight_bytes
    )


def test_a_compiled_engine_compiles_once_at_start_up_for_every_step_shape(llama: Path) -> None:
    """Level 2 traces the model once, on a small step, before the first call: no step
    shape (one token, a prefill, a mixed batch, the first call's op registration)
    compiles again, and the tokens are the eager engine's."""
    import torch
    from tiny_engine import LLM

    config = cpu_config()
    del config["model"]["enforce_eager"]
    compiled = LLM(llama, config=config)
    assert compiled.stats["compilation_level"] == 2
    assert compiled.compile_seconds > 0
    prompts = prompts_of([1, 5, 17, 40, 33])
    limits = [3, 1, 9, 2, 6]
    with torch._dynamo.config.patch(error_on_recompile=True):
        got = compiled.generate(prompts, max_tokens=limits, ignore_eos=True)
    eager = LLM(llama, config=cpu_config()).generate(prompts, max_tokens=limits, ignore_eos=True)
    assert got == eager


def test_the_cpu_engine_runs_its_linears_on_the_native_gemm_from_the_weights_themselves(
    llama: Path,
) -> None:
    """The CPU platform's GEMM (``linear_backend``) reaches every linear layer, and no
    packed copy of a weight is made: each layer multiplies by its own parameter."""
    import torch
    from tiny_engine import LLM
    from tiny_engine.model import Linear

    llm = LLM(llama, config=cpu_config())
    linears = [m for m in llm.model.modules() if isinstance(m, Linear)]
    assert linears and {m.gemm for m in linears} == {llm.platform.linear_backend} == {"native"}
    assert all(isinstance(m.weight, torch.nn.Parameter) for m in linears)


_LOAD_PEAK = """
import json, sys
import psutil
import torch
from tiny_engine.checkpoint import iter_weights, read_checkpoint
from tiny_engine.model import CausalLM, load_weights

def peak():  # VmHWM: ru_maxrss would start from the parent's resident memory at fork
    with open("/proc/self/status") as status:
        return next(int(l.split()[1]) * 1024 for l in status if l.startswith("VmHWM:"))

spec = read_checkpoint(sys.argv[1])
torch.ones(1)
before = psutil.Process().memory_info().rss  # the peak so far may be an import's
with torch.no_grad():
    model = CausalLM(spec, "torch", 64)
    load_weights(model, iter_weights(spec.path))
weights = sum(p.numel() * p.element_size() for p in model.parameters())
print(json.dumps({"weights": weights, "grew": peak() - before}))
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmHWM (Linux)")
def test_loading_holds_the_weights_once_at_its_peak(
    make_ckpt: Callable[..., Path], tmp_path: Path
) -> None:
    """Building the model initialises nothing and each checkpoint tensor is read through
    its own mapping of the file: the peak resident memory of building and loading grows
    by about the weights' size, not twice it (a whole-shard mapping kept every page
    read resident beside the model's copy; a random initialisation touched every
    parameter before the checkpoint overwrote it)."""
    import json
    import subprocess
    import sys

    # about 48 MiB of float32 weights in one shard: large beside the process's noise
    path = make_ckpt(
        "load-peak",
        arch="llama",
        layers=4,
        hidden=512,
        intermediate=1024,
        vocab=8192,
        heads=8,
        kv_heads=4,
        max_positions=64,
        shard_size="1GB",
    )
    script = tmp_path / "peak.py"
    script.write_text(_LOAD_PEAK)
    out = subprocess.run(
        [sys.executable, str(script), str(path)], capture_output=True, text=True, check=True
    )
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    assert figures["weights"] > 40 << 20
    assert figures["grew"] <= 1.35 * figures["weights"], figures
