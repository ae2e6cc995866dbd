"""The parallel section: how ranks split the model."""

from __future__ import annotations

import hashlib
from typing import Literal

from pydantic.dataclasses import dataclass

from hwplug.core.config._common import CONFIG, ConfigSection, PositiveInt, config_section

__all__ = ["DistributedExecutorBackend", "ParallelConfig"]

#: How worker processes are launched.
DistributedExecutorBackend = Literal["mp", "ray", "uni", "external_launcher"]


@config_section
@dataclass(config=CONFIG)
class ParallelConfig(ConfigSection):
    """Tensor, pipeline and data parallelism."""

    section = "parallel"

    tensor_parallel_size: PositiveInt = 1
    """Ranks each layer is split across."""
    pipeline_parallel_size: PositiveInt = 1
    """Pipeline stages the layers are split into."""
    data_parallel_size: PositiveInt = 1
    """Independent replicas of the whole model."""
    distributed_executor_backend: DistributedExecutorBackend | None = None
    """Worker launcher (mp, ray, uni, external_launcher); ``None`` lets the platform choose."""

    @property
    def world_size(self) -> int:
        """Ranks serving one replica: tensor x pipeline parallel size.

        Data-parallel replicas are separate worlds, so ``data_parallel_size``
        does not count.
        """
        return self.tensor_parallel_size * self.pipeline_parallel_size

    def compute_hash(self) -> str:
        """SHA-256 hex of the parallel sizes (they shape the sharded graph)."""
        factors = [self.tensor_parallel_size, self.pipeline_parallel_size, self.data_parallel_size]
        return hashlib.sha256(str(factors).encode()).hexdigest()
