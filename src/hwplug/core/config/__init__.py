"""Typed config models: what an engine asks of the platform.

Each section is a pydantic dataclass validated on construction and on every
assignment; :class:`EngineConfig` groups them and loads them from dicts and
JSON, YAML or TOML files. Importing this package does not import torch.
"""

from __future__ import annotations

from hwplug.core.config.attention import AttentionConfig
from hwplug.core.config.cache import CacheConfig
from hwplug.core.config.compilation import CallableInductorPass, CompilationConfig
from hwplug.core.config.cudagraph_mode import CompilationLevel, CUDAGraphMode
from hwplug.core.config.engine import EngineConfig
from hwplug.core.config.model import ModelConfig
from hwplug.core.config.parallel import ParallelConfig
from hwplug.core.config.pass_config import PassConfig
from hwplug.core.config.scheduler import SchedulerConfig

__all__ = [
    "AttentionConfig",
    "CUDAGraphMode",
    "CacheConfig",
    "CallableInductorPass",
    "CompilationConfig",
    "CompilationLevel",
    "EngineConfig",
    "ModelConfig",
    "ParallelConfig",
    "PassConfig",
    "SchedulerConfig",
]
