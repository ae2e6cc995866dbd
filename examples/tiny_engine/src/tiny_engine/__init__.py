"""tiny_engine: a small inference engine that serves real checkpoints on hwplug.

``LLM(model_dir)`` loads a Llama, Qwen2 or Qwen3 checkpoint, resolves its
configuration with ``hwplug.resolve`` and generates with continuous batching,
paged attention through hwplug's attention backends, prefix caching and the
platform's compilation and graph capture. It is the template an engine author
copies, and the end-to-end test of hwplug's runtime services.

The names below are imported when first used: ``python -m tiny_engine --help``
and the checks the command makes before it loads a model import no torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tiny_engine.checkpoint import (
        ARCHITECTURES,
        CheckpointError,
        ModelSpec,
        read_checkpoint,
    )
    from tiny_engine.engine import LLM
    from tiny_engine.settings import engine_config_for

__all__ = [
    "ARCHITECTURES",
    "LLM",
    "CheckpointError",
    "ModelSpec",
    "engine_config_for",
    "read_checkpoint",
]
__version__ = "0.1.0"

_HOMES = {
    "ARCHITECTURES": "tiny_engine.checkpoint",
    "CheckpointError": "tiny_engine.checkpoint",
    "ModelSpec": "tiny_engine.checkpoint",
    "read_checkpoint": "tiny_engine.checkpoint",
    "LLM": "tiny_engine.engine",
    "engine_config_for": "tiny_engine.settings",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'tiny_engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
