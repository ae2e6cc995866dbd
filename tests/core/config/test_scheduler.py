"""SchedulerConfig: batch limits and graph-size defaults."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from hwplug.core.config import SchedulerConfig


def test_defaults() -> None:
    scheduler = SchedulerConfig()
    assert scheduler.max_num_seqs == 256
    assert scheduler.max_num_batched_tokens == 8192
    assert scheduler.enable_chunked_prefill is None
    assert scheduler.cuda_graph_sizes == [512]


@pytest.mark.parametrize(("seqs", "size"), [(1, 2), (8, 16), (255, 510), (256, 512), (1000, 512)])
def test_unset_graph_sizes_default_to_twice_the_batch_capped_at_512(seqs: int, size: int) -> None:
    assert SchedulerConfig(max_num_seqs=seqs).cuda_graph_sizes == [size]
    assert SchedulerConfig(max_num_seqs=seqs, cuda_graph_sizes=[]).cuda_graph_sizes == [size]


def test_explicit_graph_sizes_are_kept() -> None:
    assert SchedulerConfig(cuda_graph_sizes=[3, 1, 3]).cuda_graph_sizes == [3, 1, 3]


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_num_seqs", 0), ("max_num_batched_tokens", -1), ("cuda_graph_sizes", [0])],
)
def test_limits_must_be_positive(field: str, value: object) -> None:
    with pytest.raises(ValidationError, match=field):
        SchedulerConfig(**{field: value})  # type: ignore[arg-type]


def test_chunked_prefill_is_tri_state() -> None:
    assert SchedulerConfig(enable_chunked_prefill=False).enable_chunked_prefill is False
    with pytest.raises(ValidationError, match="enable_chunked_prefill"):
        SchedulerConfig(enable_chunked_prefill="sometimes")  # type: ignore[arg-type]
