"""A simulated H100's whole resolved flow, run on CPU tensors.

Piecewise compilation through hwplug's backend, the platform's CUDA-graph
wrapper on hwplug's recording graph backend, the GraphDispatcher's padded
keys, and the Triton attention under the interpreter: the tokens are
transformers' own. Each run is a fresh process started with
``TRITON_INTERPRET=1``, so neither the interpreter setting nor compiled state
leaks into other tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.engine.conftest import ENGINE_SRC, cpu_config, prompts_of
from tests.engine.reference import Reference, assert_matches

pytest.importorskip("transformers")
pytest.importorskip("triton")

SCRIPT = """
import json, sys
from tiny_engine import LLM

path, compilation, prompts = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
config = {
    "model": {"dtype": "float32", "max_model_len": 64},
    "cache": {"num_gpu_blocks_override": 16},
    "scheduler": {"max_num_seqs": 2, "max_num_batched_tokens": 32, "cuda_graph_sizes": [2]},
    "compilation": {"use_inductor": False, **compilation},
}
llm = LLM(path, config=config, platform="h100", device="cpu")
outputs = llm.generate(prompts, max_tokens=3, ignore_eos=True)
backend = llm.runner.graph_backend
print(json.dumps({
    "outputs": outputs,
    "stats": llm.stats,
    "captured": sorted({mode.name for mode, _ in llm.captured}),
    "captures": len(backend.captures),
    "replays": len(backend.replays),
}))
"""


@pytest.fixture(scope="module")
def small(make_ckpt: Callable[..., Path]) -> Path:
    # head size 32: the smallest the Triton kernel takes
    return make_ckpt("small-h32", arch="llama", layers=1, heads=2, kv_heads=1)


def _run(small: Path, compilation: dict[str, Any]) -> dict[str, Any]:
    prompts = prompts_of([3, 7, 5])
    env = dict(os.environ, TRITON_INTERPRET="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ENGINE_SRC), env.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(small), json.dumps(compilation), json.dumps(prompts)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    run = json.loads(result.stdout.strip().splitlines()[-1])
    stats = run["stats"]
    assert (stats["platform"], stats["profile"], stats["device"]) == ("cuda", "h100", "cpu")
    assert stats["compilation_level"] == 3 and stats["attention_backend"] == "triton"
    assert run["captures"] >= stats["graphs_captured"] > 0  # a key: one graph per piece
    assert run["replays"] > 0, "no step replayed a captured graph"
    ref = Reference(small)
    for prompt, ours in zip(prompts, run["outputs"]):
        assert_matches(ref, prompt, ours, ref.generate(prompt, 3))
    return run


def test_simulated_h100_runs_its_resolved_flow_on_cpu(small: Path) -> None:
    """The defaults: level 3, FULL graphs for decode batches, piecewise for the rest."""
    run = _run(small, {})
    assert run["stats"]["cudagraph_mode"] == "FULL_AND_PIECEWISE"
    assert run["captured"] == ["FULL", "PIECEWISE"]


def test_piecewise_graphs_split_at_hwplug_attention_give_the_same_tokens(small: Path) -> None:
    """Pieces replayed around the eager attention op read this step's values."""
    run = _run(
        small,
        {"cudagraph_mode": "PIECEWISE", "splitting_ops": ["hwplug.unified_attention_with_output"]},
    )
    assert run["stats"]["cudagraph_mode"] == "PIECEWISE"
    assert run["captured"] == ["PIECEWISE"]


def test_simulated_platform_needs_a_device(small: Path) -> None:
    from tiny_engine import LLM

    from hwplug import ConfigError

    with pytest.raises(ConfigError, match="device='cpu'"):
        LLM(small, config=cpu_config(), platform="h100")
