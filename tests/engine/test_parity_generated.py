"""Greedy parity with transformers on checkpoints generated over SPEC 13's shape space.

Hypothesis draws the checkpoint (architecture, head size 32-256, query/key-value
head ratio 1-8, head size unequal to hidden/heads, tied or untied embeddings,
q/k/v and MLP biases, q/k norms, random norm weights, rope theta and scaling
(default, linear, llama3, yarn, dynamic),
sliding windows), the prompts (lengths on and off block edges, batched and
alone) and the engine's scheduling (chunked prefill with small budgets, prefix
caching), then compares tiny_engine's fp32 greedy tokens with transformers'
``generate()`` by SPEC 13's rule (a differing token only at a tie of 1e-4).

The example budget is fixed so that ``make test`` stays fast; a nightly-style
run raises it: ``HWPLUG_PARITY_EXAMPLES=200`` (eager examples; compiled and
Triton runs get a sixth and a twelfth of it, at least one each) and
``HWPLUG_PARITY_RANDOM=1`` (fresh examples instead of the fixed sequence).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.engine.conftest import ENGINE_SRC
from tests.engine.reference import Reference, assert_matches

pytest.importorskip("transformers")
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

EXAMPLES = int(os.environ.get("HWPLUG_PARITY_EXAMPLES", "10"))
RANDOM = os.environ.get("HWPLUG_PARITY_RANDOM", "") not in ("", "0")
MAX_TOKENS = 8
BLOCK = 16


def _settings(examples: int) -> Any:
    return settings(
        max_examples=max(1, examples),
        deadline=None,
        derandomize=not RANDOM,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        print_blob=True,
    )


@dataclass
class Shape:
    """One generated checkpoint: ``make_checkpoint`` keywords and the prompts to run."""

    options: dict[str, Any]
    prompts: list[list[int]]
    scheduler: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        return json.dumps({"options": self.options, "scheduler": self.scheduler})


@st.composite
def shapes(
    draw: st.DrawFn, head_sizes: tuple[int, ...] = (32, 48, 64, 80, 96, 112, 128, 256)
) -> Shape:
    arch = draw(st.sampled_from(["llama", "qwen2", "qwen3"]))
    kv_heads = draw(st.sampled_from([1, 2]))
    heads = kv_heads * draw(st.sampled_from([1, 2, 3, 4, 5, 8]))
    head_dim = draw(st.sampled_from(head_sizes))
    # transformers wants hidden_size a multiple of the heads; head_dim is set apart
    hidden = heads * draw(st.sampled_from([8, 16, 24, 32]))
    vocab = draw(st.integers(128, 700))
    max_positions = draw(st.sampled_from([128, 256]))
    overrides: dict[str, Any] = {
        "rope_theta": draw(st.sampled_from([10000.0, 500000.0, 1000000.0])),
        "rms_norm_eps": draw(st.sampled_from([1e-6, 1e-5])),
    }
    if arch == "llama":
        overrides["attention_bias"] = draw(st.booleans())
        overrides["mlp_bias"] = draw(st.booleans())
    layers = draw(st.integers(1, 2))
    if arch != "llama" and draw(st.booleans()):
        window = draw(st.sampled_from([5, 16, 23]))
        kinds = draw(
            st.lists(
                st.sampled_from(["full_attention", "sliding_attention"]),
                min_size=layers,
                max_size=layers,
            )
        )
        overrides.update(
            {"use_sliding_window": True, "sliding_window": window, "layer_types": kinds}
        )
    scaling = draw(st.sampled_from(["default", "linear", "llama3", "yarn", "dynamic"]))
    rope_scaling: dict[str, Any] | None = None
    if scaling == "yarn":
        rope_scaling = {
            "rope_type": "yarn",
            "factor": draw(st.sampled_from([2.0, 4.0, 8.0])),
            "original_max_position_embeddings": draw(st.sampled_from([16, 32, 64])),
        }
        if draw(st.booleans()):
            rope_scaling["beta_fast"] = draw(st.sampled_from([8.0, 16.0]))
        if draw(st.booleans()):
            rope_scaling.update({"mscale": 1.0, "mscale_all_dim": 0.5})
    elif scaling == "dynamic":
        rope_scaling = {"rope_type": "dynamic", "factor": draw(st.sampled_from([2.0, 4.0]))}
    elif scaling == "linear":
        rope_scaling = {"rope_type": "linear", "factor": draw(st.sampled_from([2.0, 4.0]))}
    elif scaling == "llama3":
        rope_scaling = {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        }
    if rope_scaling is not None:
        rope_scaling["rope_theta"] = overrides["rope_theta"]
    options: dict[str, Any] = {
        "arch": arch,
        "layers": layers,
        "hidden": hidden,
        "heads": heads,
        "kv_heads": kv_heads,
        "head_dim": head_dim,
        "intermediate": draw(st.sampled_from([64, 96, 200])),
        "vocab": vocab,
        "max_positions": max_positions,
        "tie": draw(st.booleans()),
        "init_std": draw(st.sampled_from([0.05, 0.2, 0.5])),
        "norm_std": 0.3,
        "seed": draw(st.integers(0, 2**16)),
        "eos_token_id": vocab - 1,
        "rope_scaling": rope_scaling,
        "config_overrides": overrides,
    }
    edge = st.sampled_from([1, BLOCK - 1, BLOCK, BLOCK + 1, 2 * BLOCK, 2 * BLOCK + 1, 3 * BLOCK])
    lengths = draw(st.lists(st.one_of(edge, st.integers(1, 70)), min_size=1, max_size=3))
    prompts = [draw(st.lists(st.integers(3, vocab - 2), min_size=n, max_size=n)) for n in lengths]
    scheduler: dict[str, Any] = {}
    if draw(st.booleans()):
        budget = draw(st.sampled_from([8, 20, 33]))
        scheduler = {"max_num_batched_tokens": budget, "max_num_seqs": min(budget, 8)}
    return Shape(options, prompts, scheduler)


def _engine_config(shape: Shape, *, eager: bool) -> dict[str, Any]:
    model: dict[str, Any] = {"dtype": "float32"}
    if eager:
        model["enforce_eager"] = True
    config: dict[str, Any] = {"model": model, "cache": {"kv_cache_memory_bytes": 16 << 20}}
    if shape.scheduler:
        config["scheduler"] = dict(shape.scheduler, enable_chunked_prefill=True)
    return config


def _write(shape: Shape, directory: Path) -> Path:
    from tiny_engine.make_checkpoint import make_checkpoint

    return make_checkpoint(directory, **shape.options)


def _compare(path: Path, shape: Shape, batched: list[list[int]], alone: list[int]) -> None:
    ref = Reference(path)
    for prompt, ours in zip(shape.prompts, batched):
        assert_matches(ref, prompt, ours, ref.generate(prompt, MAX_TOKENS))
    assert alone == batched[0], "the first prompt alone and in its batch differ"


def _run_in_process(shape: Shape, *, eager: bool) -> None:
    from tiny_engine import LLM

    with tempfile.TemporaryDirectory() as tmp:
        path = _write(shape, Path(tmp))
        llm = LLM(path, config=_engine_config(shape, eager=eager))
        batched = llm.generate(shape.prompts, max_tokens=MAX_TOKENS, ignore_eos=True)
        alone = llm.generate(shape.prompts[:1], max_tokens=MAX_TOKENS, ignore_eos=True)[0]
        try:
            _compare(path, shape, batched, alone)
        except AssertionError as exc:
            raise AssertionError(f"{shape.describe()}: {exc}") from None


@_settings(EXAMPLES)
@given(shape=shapes())
def test_eager_generations_equal_transformers(shape: Shape) -> None:
    _run_in_process(shape, eager=True)


@_settings(max(1, EXAMPLES // 6))
@given(shape=shapes())
def test_compiled_generations_equal_transformers(shape: Shape) -> None:
    """The CPU's default compilation (level 2, Inductor)."""
    _run_in_process(shape, eager=False)


TRITON_SCRIPT = """
import json, sys
from tiny_engine import LLM

path, config, prompts, max_tokens = sys.argv[1], *map(json.loads, sys.argv[2:5])
llm = LLM(path, config=config, platform="h100", device="cpu")
batched = llm.generate(prompts, max_tokens=max_tokens, ignore_eos=True)
alone = llm.generate(prompts[:1], max_tokens=max_tokens, ignore_eos=True)[0]
print(json.dumps({"batched": batched, "alone": alone, "backend": llm.stats["attention_backend"]}))
"""


@_settings(max(1, EXAMPLES // 12))
@given(shape=shapes(head_sizes=(32, 48, 64, 80, 96, 112, 128)))
def test_triton_backend_generations_equal_transformers(shape: Shape) -> None:
    """A simulated H100 (Triton attention, interpreted) on CPU tensors, eagerly."""
    pytest.importorskip("triton")
    config = _engine_config(shape, eager=True)
    config["cache"] = {"num_gpu_blocks_override": 64}
    config["compilation"] = {"use_inductor": False}
    env = dict(os.environ, TRITON_INTERPRET="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ENGINE_SRC), env.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory() as tmp:
        path = _write(shape, Path(tmp))
        args = [json.dumps(config), json.dumps(shape.prompts), str(MAX_TOKENS)]
        result = subprocess.run(
            [sys.executable, "-c", TRITON_SCRIPT, str(path), *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=900,
            check=False,
        )
        assert result.returncode == 0, f"{shape.describe()}: {result.stderr[-3000:]}"
        run = json.loads(result.stdout.strip().splitlines()[-1])
        assert run["backend"] == "triton"
        try:
            _compare(path, shape, run["batched"], run["alone"])
        except AssertionError as exc:
            raise AssertionError(f"{shape.describe()}: {exc}") from None
