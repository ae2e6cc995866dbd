"""Attention backends: the contract, the built-ins and the registry.

- :class:`AttentionBackend`: the base class of every backend;
- :class:`AttentionCall`: one layer's call for one step (tensors, step, scales)
  as one object, what ``forward_call`` and ``attend`` take;
- :class:`AttentionMetadata`: one step's batch layout, built once per step from
  host values (:meth:`AttentionMetadata.build`);
- ``backend_cls.prepare(metadata, num_blocks=..., block_size=...)``: what a
  backend derives from a step, once, before the first layer; engines run the
  model inside :func:`forward_context` with it, and no layer's ``forward``
  reads anything back from the device;
- :class:`TorchAttentionBackend` (``torch``) and :class:`TritonAttentionBackend`
  (``triton``): the built-in backends;
- :func:`get_backend` / :func:`available_backends`: look backends up by name;
  :func:`backends_for`: those that may serve a platform (a backend's
  ``platforms``; a plugin's backend serves its own distribution's platforms);
- :func:`unified_attention`: what an engine's attention layer calls; it runs
  through the ``hwplug::unified_attention`` torch custom op, which
  ``torch.compile`` treats as opaque (a splitting op for piecewise compilation).

Importing this package does not import torch, and neither does
:meth:`AttentionBackend.problem`: resolution runs torch-free.
"""

from __future__ import annotations

from hwplug.attention.base import ANY_PLATFORM, AttentionBackend, PreparedStep, metadata_of
from hwplug.attention.call import AttentionCall
from hwplug.attention.context import current_step, current_step_variable, forward_context
from hwplug.attention.metadata import AttentionMetadata
from hwplug.attention.ops import register_unified_attention, unified_attention
from hwplug.attention.registry import (
    BUILTIN_BACKENDS,
    BackendTable,
    available_backends,
    backends_for,
    collect_backends,
    get_backend,
    lookup_backend,
)
from hwplug.attention.torch_backend import TorchAttentionBackend, TorchAttentionStep
from hwplug.attention.triton_backend import TritonAttentionBackend

__all__ = [
    "ANY_PLATFORM",
    "BUILTIN_BACKENDS",
    "AttentionBackend",
    "AttentionCall",
    "AttentionMetadata",
    "BackendTable",
    "PreparedStep",
    "TorchAttentionBackend",
    "TorchAttentionStep",
    "TritonAttentionBackend",
    "available_backends",
    "backends_for",
    "collect_backends",
    "current_step",
    "current_step_variable",
    "forward_context",
    "get_backend",
    "lookup_backend",
    "metadata_of",
    "register_unified_attention",
    "unified_attention",
]
