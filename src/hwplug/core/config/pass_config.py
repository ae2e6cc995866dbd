"""Switches of the custom graph passes run by the compiler."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

from pydantic.dataclasses import dataclass

from hwplug.core.config._common import CONFIG, ConfigSection, PositiveInt, config_section, logger

__all__ = ["PassConfig"]

# Fields that only control debugging output, not the compiled graph.
_DEBUG_FIELDS = frozenset({"dump_graph_stages", "dump_graph_dir"})


@config_section
@dataclass(config=CONFIG)
class PassConfig(ConfigSection):
    """Which fusion and parallelism passes the compiler runs, and graph dumps."""

    section = "compilation.pass_config"

    enable_fusion: bool = False
    """Fuse normalisation and activation ops with the quantisation that follows."""
    enable_attn_fusion: bool = False
    """Fuse attention with the output quantisation."""
    enable_noop: bool = False
    """Remove no-op reshapes and slices (the fusions rely on it)."""
    enable_sequence_parallelism: bool = False
    """Split the residual stream across tensor-parallel ranks between layers."""
    enable_async_tp: bool = False
    """Overlap tensor-parallel GEMMs with their collectives."""
    enable_fi_allreduce_fusion: bool = False
    """Fuse all-reduce with the following RMSNorm (FlashInfer)."""
    fi_allreduce_fusion_max_token_num: PositiveInt = 16384
    """Largest batch, in tokens, the fused all-reduce handles."""
    dump_graph_stages: list[str] = dataclasses.field(default_factory=list)
    """Pass stages after which the graph is written out, for debugging."""
    dump_graph_dir: Path = Path(".")
    """Directory the debugging graph dumps go to."""

    def __post_init__(self) -> None:
        if not self.enable_noop:
            for name in ("enable_fusion", "enable_attn_fusion"):
                if getattr(self, name):
                    logger.warning(
                        "compilation.pass_config.%s is on but enable_noop is off: "
                        "the fusion may not match anything; turn on enable_noop",
                        name,
                    )

    def uuid(self) -> str:
        """SHA-256 hex of the fields that change compilation (not the dump settings).

        The same in every process: the fields are hashed as sorted JSON.
        """
        relevant = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name not in _DEBUG_FIELDS
        }
        return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()
