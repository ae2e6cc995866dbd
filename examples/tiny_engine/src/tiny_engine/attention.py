"""Which hwplug attention backend the engine runs, and a check that it can.

The model's layers call ``hwplug.attention.unified_attention`` (the
``hwplug::unified_attention`` custom op, opaque to ``torch.compile`` and the
point where piecewise compilation splits the graph) with the backend named
here: the resolved ``attention.backend``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hwplug import ConfigError

if TYPE_CHECKING:
    import torch

    from hwplug.core.config import EngineConfig
    from hwplug.core.platform import Platform

__all__ = ["DEFAULT_BACKEND", "resolved_backend"]

DEFAULT_BACKEND = "torch"
"""Used only while the resolved config names no backend (an hwplug before SPEC 12's
resolution step): the one backend every platform can run."""


def resolved_backend(
    config: EngineConfig, platform: Platform, device: torch.device | None = None
) -> str:
    """The attention backend of a resolved config, checked against the platform and, when
    given, the device the tensors live on (a simulated platform's run on CPU tensors:
    Triton kernels then need ``TRITON_INTERPRET=1``).

    :raises hwplug.ConfigError: an unknown backend, or one that cannot serve
        this model, cache and device (its ``problem()``).
    """
    from hwplug.attention import get_backend

    section = getattr(config, "attention", None)
    name: str = getattr(section, "backend", None) or DEFAULT_BACKEND
    backend = get_backend(name)
    problem = backend.problem(config, platform)
    if problem is None and device is not None and backend.uses_triton:
        from hwplug.kernels import triton_unavailable_reason

        problem = triton_unavailable_reason(device)
    if problem is not None:
        raise ConfigError(f"attention.backend={name!r} cannot run here: {problem}")
    return name
