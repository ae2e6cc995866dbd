"""The scheduler section: how many sequences and tokens a step may hold."""

from __future__ import annotations

import dataclasses

from pydantic.dataclasses import dataclass

from hwplug.core.config._common import CONFIG, ConfigSection, Size, config_section

__all__ = ["SchedulerConfig"]

# Default capture-size bound: twice the batch, at most this.
_MAX_DEFAULT_GRAPH_SIZE = 512


@config_section
@dataclass(config=CONFIG)
class SchedulerConfig(ConfigSection):
    """Batch limits of one engine step."""

    section = "scheduler"

    max_num_seqs: Size = 256
    """Most sequences in one step."""
    max_num_batched_tokens: Size = 8192
    """Most tokens in one step."""
    enable_chunked_prefill: bool | None = None
    """Split long prompts across steps; ``None`` lets the platform decide."""
    cuda_graph_sizes: list[Size] = dataclasses.field(default_factory=list)
    """Graph capture sizes: one value N expands to 1, 2, 4 and multiples of 8 up to N;
    several are used as given. Empty means ``[min(2 * max_num_seqs, 512)]``."""

    def __post_init__(self) -> None:
        if not self.cuda_graph_sizes:
            self.cuda_graph_sizes = [self.default_graph_size()]

    def default_graph_size(self) -> int:
        """The single capture-size bound used when none is given."""
        return min(2 * self.max_num_seqs, _MAX_DEFAULT_GRAPH_SIZE)
