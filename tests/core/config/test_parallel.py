"""ParallelConfig: sizes, executor backend, derived world size."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from hwplug.core.config import ParallelConfig
from hwplug.core.errors import ConfigError


def test_defaults() -> None:
    parallel = ParallelConfig()
    assert parallel.to_dict() == {
        "tensor_parallel_size": 1,
        "pipeline_parallel_size": 1,
        "data_parallel_size": 1,
        "distributed_executor_backend": None,
    }
    assert parallel.world_size == 1


def test_world_size_is_tensor_times_pipeline_and_ignores_data_parallel() -> None:
    parallel = ParallelConfig(
        tensor_parallel_size=4, pipeline_parallel_size=2, data_parallel_size=3
    )
    assert parallel.world_size == 8
    parallel.tensor_parallel_size = 2
    assert parallel.world_size == 4


def test_world_size_is_read_only() -> None:
    with pytest.raises(ConfigError, match=r"parallel\.world_size is derived"):
        ParallelConfig().world_size = 4  # type: ignore[misc]
    with pytest.raises(ConfigError, match=r"parallel\.world_size is derived.*tensor_parallel_size"):
        ParallelConfig(world_size=4)  # type: ignore[call-arg]


@pytest.mark.parametrize("backend", ["mp", "ray", "uni", "external_launcher", None])
def test_executor_backends(backend: str | None) -> None:
    assert ParallelConfig(distributed_executor_backend=backend).distributed_executor_backend == (  # type: ignore[arg-type]
        backend
    )


def test_unknown_executor_backend_names_the_allowed_ones() -> None:
    with pytest.raises(
        ValidationError, match=r"distributed_executor_backend[\s\S]*'mp', 'ray', 'uni'"
    ):
        ParallelConfig(distributed_executor_backend="slurm")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "field", ["tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"]
)
def test_sizes_must_be_positive(field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        ParallelConfig(**{field: 0})  # type: ignore[arg-type]
