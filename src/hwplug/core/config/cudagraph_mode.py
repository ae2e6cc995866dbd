"""Graph-capture modes and compilation levels."""

from __future__ import annotations

import enum
from typing import Any

from hwplug.core.errors import ConfigError

__all__ = ["CUDAGraphMode", "CompilationLevel"]


class CompilationLevel(enum.IntEnum):
    """How much of the model ``torch.compile`` sees."""

    NO_COMPILATION = 0
    """Run eagerly."""
    DYNAMO_AS_IS = 1
    """Hand the model to Dynamo as it is (it may recompile)."""
    DYNAMO_ONCE = 2
    """Trace with Dynamo once and reuse the graph."""
    PIECEWISE = 3
    """Split the graph at the splitting ops and compile the pieces."""


class CUDAGraphMode(enum.Enum):
    """Which device graphs to capture.

    ``NONE``, ``PIECEWISE`` and ``FULL`` are also the concrete modes a batch
    runs in. The two tuple-valued modes pair a mode for uniform-decode batches
    (first) with one for every other batch (second).
    """

    NONE = 0
    """No graphs."""
    PIECEWISE = 1
    """Graphs of the pieces between splitting ops (attention stays outside)."""
    FULL = 2
    """One graph of the whole forward pass, for every batch."""
    FULL_DECODE_ONLY = (FULL, NONE)
    """Full graphs for uniform-decode batches; other batches run without graphs."""
    FULL_AND_PIECEWISE = (FULL, PIECEWISE)
    """Full graphs for uniform-decode batches, piecewise graphs for the rest."""

    @classmethod
    def parse(cls, value: Any) -> CUDAGraphMode:
        """A mode from a member, its name (any case) or its value (an int or a pair).

        :raises ConfigError: ``value`` names no mode; the message lists them.
        """
        if isinstance(value, cls):
            return value
        try:
            if isinstance(value, str):
                return cls[value.strip().upper()]
            if isinstance(value, int) and not isinstance(value, bool):
                return cls(value)
            if isinstance(value, (list, tuple)) and all(
                isinstance(v, int) and not isinstance(v, bool) for v in value
            ):
                return cls(tuple(value))
        except (KeyError, ValueError):
            pass
        allowed = ", ".join(member.name for member in cls)
        raise ConfigError(
            f"compilation.cudagraph_mode: unknown mode {value!r}; allowed modes: {allowed} "
            "(names in any case, or their values)"
        )

    def decode_mode(self) -> CUDAGraphMode:
        """The runtime mode of uniform-decode batches."""
        return CUDAGraphMode(self.value[0]) if self.separate_routine() else self

    def mixed_mode(self) -> CUDAGraphMode:
        """The runtime mode of prefill and mixed batches."""
        return CUDAGraphMode(self.value[1]) if self.separate_routine() else self

    def requires_piecewise_compilation(self) -> bool:
        """Whether either side captures piecewise graphs (needs level PIECEWISE)."""
        return CUDAGraphMode.PIECEWISE in (self.decode_mode(), self.mixed_mode())

    def max_cudagraph_mode(self) -> CUDAGraphMode:
        """The most capturing of the two sides (``FULL`` > ``PIECEWISE`` > ``NONE``)."""
        return CUDAGraphMode(max(self.value)) if self.separate_routine() else self

    def has_full_cudagraphs(self) -> bool:
        """Whether any batch is served by a full graph."""
        return self.max_cudagraph_mode() == CUDAGraphMode.FULL

    def has_piecewise_cudagraphs(self) -> bool:
        """Whether any batch is served by piecewise graphs."""
        return self.requires_piecewise_compilation()

    def separate_routine(self) -> bool:
        """Whether decode and mixed batches have different modes (a pair value)."""
        return isinstance(self.value, tuple)

    def valid_runtime_modes(self) -> bool:
        """Whether this is a concrete runtime mode: ``NONE``, ``PIECEWISE`` or ``FULL``."""
        return self in (CUDAGraphMode.NONE, CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL)

    def __str__(self) -> str:
        return self.name
