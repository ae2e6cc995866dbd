"""Typed config models: what an engine asks of the platform.

Each section is a pydantic dataclass validated on construction and on every
assignment; :class:`EngineConfig` groups them and loads them from dicts and
JSON, YAML or TOML files. Importing this package imports neither torch nor
pydantic: each name loads its module on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hwplug.core.config.attention import AttentionConfig
    from hwplug.core.config.cache import CacheConfig
    from hwplug.core.config.compilation import CallableInductorPass, CompilationConfig
    from hwplug.core.config.cudagraph_mode import CompilationLevel, CUDAGraphMode
    from hwplug.core.config.engine import EngineConfig
    from hwplug.core.config.model import ModelConfig
    from hwplug.core.config.parallel import ParallelConfig
    from hwplug.core.config.pass_config import PassConfig
    from hwplug.core.config.scheduler import SchedulerConfig

# Where each name lives: the models load (with pydantic) on first use, so that
# CUDAGraphMode and the other light parts can be imported without them.
_WHERE = {
    "AttentionConfig": "attention",
    "CacheConfig": "cache",
    "CallableInductorPass": "compilation",
    "CompilationConfig": "compilation",
    "CompilationLevel": "cudagraph_mode",
    "CUDAGraphMode": "cudagraph_mode",
    "EngineConfig": "engine",
    "ModelConfig": "model",
    "ParallelConfig": "parallel",
    "PassConfig": "pass_config",
    "SchedulerConfig": "scheduler",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))


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
