"""Registration of the ``hwplug::unified_attention`` torch custom op.

Importing this module imports torch and registers the op; :mod:`hwplug.attention.ops`
imports it on first use. (No ``from __future__ import annotations`` here:
``torch.library`` reads the signature's annotations to build the schema.)
"""

from collections.abc import Callable

import torch

from hwplug.attention.base import AttentionBackend
from hwplug.attention.call import AttentionCall
from hwplug.attention.context import current_step_variable, step_for
from hwplug.attention.metadata import AttentionMetadata
from hwplug.attention.registry import get_backend
from hwplug.attention.torch_backend import TorchAttentionBackend, TorchAttentionStep
from hwplug.kernels import op_door
from hwplug.kernels.paged_kv import shares_memory

__all__ = [
    "OP",
    "OP_WITH_OUTPUT",
    "as_scale_tensor",
    "op_arguments",
]


_MAX_INSTANCES = 256
"""Backend instances kept (one per layer shape; a model has a handful)."""

_instances: dict[tuple[object, ...], AttentionBackend] = {}


def _backend(
    name: str, call: AttentionCall, scale: float, sliding_window: int | None
) -> AttentionBackend:
    """One backend instance per backend class and layer shape (construction validates,
    so do it once); the heads and the cache dtype are the call's.

    The name is looked up in the active session's table on every call (a dict
    lookup, cached by the session until its plugins change), so the op follows
    the session: a backend whose plugin is gone is an unknown name.
    """
    query, key = call.query, call.key
    if query.dim() != 3 or key.dim() != 3:
        raise ValueError(
            "hwplug::unified_attention: query must be [num_tokens, num_heads, head_size] and "
            f"key [num_tokens, num_kv_heads, head_size]; got {list(query.shape)} and "
            f"{list(key.shape)}"
        )
    cls = get_backend(name)
    num_heads, head_size, num_kv_heads = query.shape[1], query.shape[2], key.shape[1]
    cache_dtype = call.key_cache.dtype
    shape_key = (cls, num_heads, head_size, num_kv_heads, scale, sliding_window, cache_dtype)
    impl = _instances.get(shape_key)
    if impl is None:
        impl = cls(
            num_heads,
            head_size,
            num_kv_heads,
            scale,
            sliding_window=sliding_window,
            cache_dtype=cache_dtype,
        )
        if len(_instances) >= _MAX_INSTANCES:
            _instances.clear()
        _instances[shape_key] = impl
    return impl


def op_arguments(call: AttentionCall) -> tuple[torch.Tensor, ...]:
    """The op's tensor arguments for a call, in its schema's order (up to ``v_scale``)."""
    metadata = call.metadata
    return (
        call.query,
        call.key,
        call.value,
        call.key_cache,
        call.value_cache,
        metadata.query_start_loc,
        metadata.seq_lens,
        metadata.block_table,
        metadata.slot_mapping,
        as_scale_tensor(call.k_scale, call.query),
        as_scale_tensor(call.v_scale, call.query),
    )


def _attend(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    backend: str,
    scale: float,
    sliding_window: int | None,
) -> torch.Tensor:
    """Write the step's keys and values, then attend, with the backend called ``backend``."""
    return _run(
        query,
        key,
        value,
        key_cache,
        value_cache,
        query_start_loc,
        seq_lens,
        block_table,
        slot_mapping,
        k_scale,
        v_scale,
        backend,
        scale,
        sliding_window,
        None,
        _door(query),
    )


def _run(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    backend: str,
    scale: float,
    sliding_window: "int | None",
    out: "torch.Tensor | None",
    door: "op_door.AttentionDoor | None",
) -> torch.Tensor:
    """The body of both ops (``unified_attention_with_output`` calls it directly, with its
    buffer as ``out``: one dispatch through torch's op machinery, not two). With the
    attention door open (``door``), a call computed on the native decode path has its
    layer approved there (:func:`_approve`)."""
    metadata = AttentionMetadata(query_start_loc, seq_lens, block_table, slot_mapping)
    # the step the engine prepared (forward_context), when it is this step's metadata
    step = step_for(metadata)
    call = AttentionCall(
        query,
        key,
        value,
        key_cache,
        value_cache,
        metadata if step is None else step,
        k_scale,
        v_scale,
        out,
    )
    impl = _backend(backend, call, scale, sliding_window)
    result = impl.forward_call(call)
    # (only the built-in name: every session's table has it, and always for this class,
    # so the door need not look the name up; another name may leave with its plugin)
    if (
        door is not None
        and step is not None
        and backend == TorchAttentionBackend.name
        and type(impl) is TorchAttentionBackend
    ):
        _approve(door, call, step, (k_scale, v_scale), backend, scale, sliding_window)
    return result


def _door(query: torch.Tensor) -> "op_door.AttentionDoor | None":
    """The attention door for a call on ``query``'s device (loaded and bound at the first
    CPU call in a process), or None: another device, a closed door, none built."""
    if query.device.type != "cpu":
        return None
    return op_door.attention_door(current_step_variable())


def _approve(
    door: op_door.AttentionDoor,
    call: AttentionCall,
    step: object,
    scales: tuple[torch.Tensor, torch.Tensor],
    backend: str,
    scale: float,
    sliding_window: "int | None",
) -> None:
    """Approve the layer of a call the torch backend has just computed, where the door
    computes such a call of any ticketed step exactly as the backend does: decode on the
    native kernel with the query as it is and the step's rows stored by the kernel's own
    call (the step's route), every tensor contiguous, the result written into the given
    output (or made by the op). The step's own values (which sequences decode, their
    table and lengths) are the ticket's, which ``prepare`` issues for pure decode steps
    (:meth:`TorchAttentionStep.issue_ticket`)."""
    if not isinstance(step, TorchAttentionStep):
        return
    query, key, value = call.query, call.key, call.value
    key_cache, value_cache, out = call.key_cache, call.value_cache, call.out
    route = step.route(query, key_cache, value_cache)
    if not (route.in_place and route.direct and route.stores_rows):
        return
    if not (query.is_contiguous() and key.is_contiguous() and value.is_contiguous()):
        return
    if out is not None and not (out.is_contiguous() and out.dtype == query.dtype):
        return
    door.approve_layer(
        (query, key, value), out, (key_cache, value_cache), scales, backend, scale, sliding_window
    )


def _fake_attend(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    backend: str,
    scale: float,
    sliding_window: int | None,
) -> torch.Tensor:
    return torch.empty_like(query)


def _attend_into(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    output: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    backend: str,
    scale: float,
    sliding_window: int | None,
) -> None:
    """As ``hwplug::unified_attention``, writing the result into ``output``.

    The buffer comes from the code before the op (inside the compiled piece),
    so under piecewise graphs the piece after it always reads the same memory.
    """
    if output.shape != query.shape:
        raise ValueError(
            "hwplug::unified_attention_with_output: output must have the query's shape "
            f"{list(query.shape)}; got {list(output.shape)}"
        )
    result = _run(
        query,
        key,
        value,
        key_cache,
        value_cache,
        query_start_loc,
        seq_lens,
        block_table,
        slot_mapping,
        k_scale,
        v_scale,
        backend,
        scale,
        sliding_window,
        output if _takes(output, query) else None,
        _door(query),
    )
    if result is not output:  # (a backend that made a tensor of its own)
        output.copy_(result)


def _takes(output: torch.Tensor, query: torch.Tensor) -> bool:
    """Whether the backend may write its result straight into ``output``: the query's
    dtype, contiguous, and not over the query (which attention reads to the end)."""
    return (
        output.dtype == query.dtype and output.is_contiguous() and not shares_memory(output, query)
    )


def _fake_attend_into(*args: object) -> None:
    return None


# Defined on a torch.library fragment, the way the reference engine registers its
# attention ops: one kernel for every device (CompositeExplicitAutograd) and a fake
# for tracing. ``torch.library.custom_op`` would add a Python autograd and
# ADInplaceOrView layer to every call (about a fifth of a millisecond on a CPU,
# on each layer of each step) that inference does not need; the schema (with the
# mutated caches marked) is the same, so tracing and functionalisation see the
# same op.
_LIBRARY = torch.library.Library("hwplug", "FRAGMENT")


def _register(
    name: str, kernel: Callable[..., object], fake: Callable[..., object], mutates: tuple[str, ...]
) -> None:
    schema = torch.library.infer_schema(kernel, mutates_args=mutates)
    _LIBRARY.define(name + schema)
    _LIBRARY.impl(name, kernel, "CompositeExplicitAutograd")
    torch.library.register_fake(f"hwplug::{name}", fake, lib=_LIBRARY)


# ``..._checked``: the same kernels under a second name, the validated ops the C++
# attention door (hwplug.kernels.op_door) hands every call it does not serve to; the
# door, once loaded, is the CPU kernel of the two ops themselves.
for _suffix in ("", "_checked"):
    _register("unified_attention" + _suffix, _attend, _fake_attend, ("key_cache", "value_cache"))
    _register(
        "unified_attention_with_output" + _suffix,
        _attend_into,
        _fake_attend_into,
        ("output", "key_cache", "value_cache"),
    )

OP = torch.ops.hwplug.unified_attention
"""``torch.ops.hwplug.unified_attention``: what traced graphs call."""
OP_WITH_OUTPUT = torch.ops.hwplug.unified_attention_with_output
"""``torch.ops.hwplug.unified_attention_with_output``: the variant that writes into a buffer."""


def as_scale_tensor(scale: "float | torch.Tensor", like: torch.Tensor) -> torch.Tensor:
    """A scale as the op takes it: a 0-d float32 tensor (floats are filled on ``like``'s device)."""
    if isinstance(scale, torch.Tensor):
        return scale
    return torch.full((), float(scale), dtype=torch.float32, device=like.device)
