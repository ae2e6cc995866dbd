"""Fitting the graph mode to what the attention backends can capture.

:func:`resolve_runtime_graph_mode` degrades the configured
``compilation.cudagraph_mode`` to what the attention backends can run inside
a graph (:class:`AttentionGraphSupport`); it is pure and runs once, before
capture (resolution's attention step calls it).
"""

from __future__ import annotations

import contextlib
import enum
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from hwplug.core.config import CUDAGraphMode
from hwplug.core.errors import ConfigError
from hwplug.core.graph_dispatch import as_graph_mode

if TYPE_CHECKING:
    from hwplug.core.config import CompilationConfig

__all__ = ["AttentionGraphSupport", "SupportLike", "resolve_runtime_graph_mode"]

logger = logging.getLogger("hwplug.core.graphs")


class AttentionGraphSupport(enum.IntEnum):
    """How much of a batch an attention backend can run inside a full graph.

    Ordered: a higher level supports everything a lower one does.
    """

    NEVER = 0
    """No full-graph capture at all."""
    UNIFORM_SINGLE_TOKEN_DECODE = 1
    """Batches where every request decodes exactly one token."""
    UNIFORM_BATCH = 2
    """Batches with one query length for every request (spec decode included)."""
    ALWAYS = 3
    """Any batch, mixed prefill and decode included."""


SupportLike = AttentionGraphSupport | str | int | Iterable[AttentionGraphSupport | str | int]


def _as_support(value: object) -> AttentionGraphSupport:
    if isinstance(value, AttentionGraphSupport):
        return value
    if isinstance(value, str):
        key = value.strip().upper()
        if key in AttentionGraphSupport.__members__:
            return AttentionGraphSupport[key]
    elif isinstance(value, int) and not isinstance(value, bool):
        with contextlib.suppress(ValueError):
            return AttentionGraphSupport(value)
    elif isinstance(value, Iterable):
        levels = [_as_support(v) for v in value]
        # No attention layer constrains nothing.
        return min(levels, default=AttentionGraphSupport.ALWAYS)
    allowed = ", ".join(AttentionGraphSupport.__members__)
    raise ValueError(
        f"attention graph support must be one of {allowed} (or a list of them), got {value!r}"
    )


def resolve_runtime_graph_mode(
    compilation_config: CompilationConfig,
    support: SupportLike,
    *,
    uniform_decode_query_len: int = 1,
) -> CUDAGraphMode:
    """Degrade ``compilation.cudagraph_mode`` to what the attention backends can capture.

    ``support`` is an :class:`AttentionGraphSupport` (or its name), or a list of
    them, one per attention backend in use; the weakest one decides. Pure: the
    config is not modified. The rules, in order:

    1. Mixed side FULL with support below ALWAYS: NEVER is an error; otherwise
       FULL_AND_PIECEWISE when attention is among the splitting ops, else
       FULL_DECODE_ONLY.
    2. Decode side FULL with support NEVER: PIECEWISE when attention is
       compiled piecewise, else NONE.
    3. Decode side FULL with speculative decoding (``uniform_decode_query_len``
       > 1) and support below UNIFORM_BATCH: likewise PIECEWISE or NONE.
    4. Any full graph left with support NEVER is a :class:`ConfigError`.

    :raises ConfigError: when full graphs are requested but no attention
        backend can be captured in them; the message suggests PIECEWISE.
    """
    if (
        isinstance(uniform_decode_query_len, bool)
        or not isinstance(uniform_decode_query_len, int)
        or uniform_decode_query_len < 1
    ):
        raise ValueError(
            f"uniform_decode_query_len must be a positive integer, got {uniform_decode_query_len!r}"
        )
    level = _as_support(support)
    configured = as_graph_mode(compilation_config.cudagraph_mode)
    mode = configured
    full = CUDAGraphMode.FULL

    def never_error() -> ConfigError:
        return ConfigError(
            f"compilation.cudagraph_mode={configured.name} needs full graphs, but the "
            f"attention backend's graph support is {level.name} (it cannot run inside a "
            "full graph); use compilation.cudagraph_mode=PIECEWISE (with "
            "compilation.level=3) or NONE"
        )

    if mode.mixed_mode() is full and level < AttentionGraphSupport.ALWAYS:
        if level is AttentionGraphSupport.NEVER:
            raise never_error()
        if compilation_config.splitting_ops_contain_attention():
            mode = CUDAGraphMode.FULL_AND_PIECEWISE
        else:
            mode = CUDAGraphMode.FULL_DECODE_ONLY
        logger.info(
            "attention graph support %s cannot capture mixed batches: "
            "compilation.cudagraph_mode %s -> %s",
            level.name,
            configured.name,
            mode.name,
        )

    if mode.decode_mode() is full and (
        level is AttentionGraphSupport.NEVER
        or (uniform_decode_query_len > 1 and level < AttentionGraphSupport.UNIFORM_BATCH)
    ):
        before = mode
        if compilation_config.is_attention_compiled_piecewise():
            mode = CUDAGraphMode.PIECEWISE
        else:
            mode = CUDAGraphMode.NONE
        logger.info(
            "attention graph support %s cannot capture decode batches of query length %d: "
            "compilation.cudagraph_mode %s -> %s",
            level.name,
            uniform_decode_query_len,
            before.name,
            mode.name,
        )

    if mode.has_full_cudagraphs() and level is AttentionGraphSupport.NEVER:
        raise never_error()
    return mode
