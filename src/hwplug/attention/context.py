"""The step a model's attention layers run: set once per step by the engine.

``hwplug::unified_attention`` is a torch custom op, so it takes tensors only:
the step's metadata tensors, never the backend's prepared object. The engine
prepares the step once (``backend_cls.prepare(metadata, ...)``) and runs the
model inside :func:`forward_context`; each attention op finds the prepared
step here, checks that it describes the very metadata tensors the op was
given (their memory and shapes: nothing is read from the device), and hands
it to the backend's ``forward``. An op outside any context, or given other
tensors, prepares its metadata on the spot (correct, but once per layer).

The context is a :class:`contextvars.ContextVar`: it holds per thread and per
asyncio task, and it is set outside compiled code (``torch.compile`` never
traces into the op).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any, TypeVar

from hwplug.attention.metadata import AttentionMetadata, metadata_of

__all__ = ["current_step", "current_step_variable", "forward_context", "step_for"]

_T = TypeVar("_T")

_current: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "hwplug_attention_step", default=None
)


@contextlib.contextmanager
def forward_context(prepared: _T) -> Iterator[_T]:
    """Run the model's attention layers with ``prepared`` (what the backend's
    ``prepare`` returned for this step); restores the previous step on exit."""
    if not isinstance(metadata_of(prepared), AttentionMetadata):
        raise ValueError(
            "forward_context() takes what a backend's prepare() returned (an "
            f"AttentionMetadata or a PreparedStep); got {type(prepared).__name__}"
        )
    token = _current.set(prepared)
    try:
        yield prepared
    finally:
        _current.reset(token)


def current_step() -> Any:
    """The prepared step of the innermost :func:`forward_context`, or None."""
    return _current.get()


def current_step_variable() -> contextvars.ContextVar[Any]:
    """The context variable :func:`forward_context` sets: the attention ops' C++ door
    reads it to serve a call only from the step the Python op would find here."""
    return _current


def step_for(metadata: AttentionMetadata) -> Any:
    """The current prepared step when it describes exactly ``metadata``'s tensors
    (same memory, shapes and strides), else None."""
    prepared = _current.get()
    if prepared is None:
        return None

    meta: AttentionMetadata = metadata_of(prepared)
    for name in ("query_start_loc", "seq_lens", "block_table", "slot_mapping"):
        mine, given = getattr(meta, name), getattr(metadata, name)
        if mine is given:
            continue
        try:
            same = (
                mine.data_ptr() == given.data_ptr()
                and mine.shape == given.shape
                and mine.stride() == given.stride()
                and mine.device == given.device
                and mine.dtype == given.dtype
            )
        except (RuntimeError, NotImplementedError):  # tensors without storage (fakes)
            same = False
        if not same:
            return None
    return prepared
