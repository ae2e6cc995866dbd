"""tiny_engine: a small inference engine that serves real checkpoints on hwplug.

``LLM(model_dir)`` loads a Llama, Qwen2 or Qwen3 checkpoint, resolves its
configuration with ``hwplug.resolve`` and generates with continuous batching,
paged attention through hwplug's attention backends, prefix caching and the
platform's compilation and graph capture. It is the template an engine author
copies, and the end-to-end test of hwplug's runtime services.
"""

from __future__ import annotations

from tiny_engine.checkpoint import ARCHITECTURES, CheckpointError, ModelSpec, read_checkpoint
from tiny_engine.engine import LLM, engine_config_for

__all__ = [
    "ARCHITECTURES",
    "LLM",
    "CheckpointError",
    "ModelSpec",
    "engine_config_for",
    "read_checkpoint",
]
__version__ = "0.1.0"
