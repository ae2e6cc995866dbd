"""Fixtures for the tiny_engine tests: importable package, small random checkpoints.

tiny_engine is imported from its installed distribution when there is one,
else straight from ``examples/tiny_engine/src``. Checkpoints are written with
transformers (the tests that need them skip without it) once per session.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
ENGINE_SRC = REPO / "examples" / "tiny_engine" / "src"

try:
    import tiny_engine  # noqa: F401
except ImportError:
    sys.path.insert(0, str(ENGINE_SRC))

# Small enough that a whole generate() takes milliseconds; init_std makes the
# logits spread out, so near-ties (where fp32 rounding may pick either token) are rare.
TINY: dict[str, Any] = {
    "layers": 2,
    "hidden": 64,
    "heads": 4,
    "kv_heads": 2,
    "vocab": 256,
    "max_positions": 256,
    "init_std": 0.2,
}


@pytest.fixture(scope="session")
def make_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``make_ckpt(name, **options)``: a checkpoint written once per session per name."""
    pytest.importorskip("transformers")
    from tiny_engine.make_checkpoint import make_checkpoint

    made: dict[str, Path] = {}

    def make(name: str, **options: Any) -> Path:
        if name not in made:
            made[name] = make_checkpoint(tmp_path_factory.mktemp(name), **{**TINY, **options})
        return made[name]

    return make


@pytest.fixture(scope="session")
def llama(make_ckpt: Callable[..., Path]) -> Path:
    return make_ckpt("llama", arch="llama")


@pytest.fixture(scope="session")
def qwen3(make_ckpt: Callable[..., Path]) -> Path:
    return make_ckpt("qwen3", arch="qwen3")


def cpu_config(**sections: dict[str, Any]) -> dict[str, Any]:
    """An fp32, eager config with a small KV cache, plus ``sections`` merged in."""
    config: dict[str, Any] = {
        "model": {"dtype": "float32", "enforce_eager": True},
        "cache": {"kv_cache_memory_bytes": 8 << 20},
    }
    for name, values in sections.items():
        config.setdefault(name, {}).update(values)
    return config


def prompts_of(lengths: list[int], vocab: int = 256, seed: int = 0) -> list[list[int]]:
    """Random prompts of the given lengths (token ids 3.. avoid bos/eos)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]
