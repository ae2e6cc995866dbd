"""The ops' C++ doors: a compiled step without per-call Python.

The attention ops' door (``csrc/attention_door.cpp``, :class:`AttentionDoor`) is
described there and in :func:`attention_door`; this docstring is the linear op's.

A compiled step (Inductor's C++ wrapper, the CPU's host step graphs) calls
each linear's op through torch's dispatcher. With only a Python kernel, each
call entered Python: about 20 us of dispatch, checks and ctypes a call, 49
calls a step of a 12-layer model. The door is a C++ kernel of the op
(``csrc/op_door.cpp``) that runs the native kernel straight from the
dispatcher for calls whose *layout* (dtypes, sizes and strides of ``x``, the
weight and the bias) the validated Python door has checked before:

- ``hwplug::native_linear_checked`` (defined by :mod:`hwplug.kernels.linear`)
  checks a call as ``hwplug::native_linear``'s Python kernel always has,
  computes it, and approves its layout with the kernel it chose
  (:func:`approve`);
- the C++ door looks each call's layout up among the approved: found, it
  calls that kernel with the tensors' pointers; not found (a layout's first
  call, any misuse), or a kernel status that is not 0, it hands the call to
  ``native_linear_checked``, which raises the named error or computes it.

So no layout reaches C from the door that Python has not checked, and a
misused op gets the same errors as before. The door is built on the first
call of the op in a process (about ten seconds once per machine, with torch's
headers; cached and checked like the C kernels: :func:`hwplug.kernels.native.
door_library`) and closed by ``HWPLUG_NATIVE_DOOR=0`` or
``HWPLUG_NATIVE_KERNELS=0``, which the door reads at each call. Where it cannot
be built (no C++ compiler, no torch headers), every call takes the Python
door, as before.
"""

from __future__ import annotations

import ctypes
import struct
import threading
import weakref

import torch

from hwplug.kernels import bindings, native

__all__ = [
    "AttentionDoor",
    "active",
    "approve",
    "approved_layouts",
    "attention_door",
    "bound_attention_door",
    "open_door",
    "unavailable_reason",
]

_SCALAR_TYPES = {torch.float16: 5, torch.float32: 6, torch.float64: 7, torch.bfloat16: 15}
"""torch's C++ codes (``c10::ScalarType``) of the dtypes a layout names."""
_PATHS = {None: 0, "row": 1, "amx": 2, "dpbf16": 3}
"""The door's code for each kernel path (:func:`hwplug.kernels.cpu_linear.pairs_path`)."""
_FIELDS = ctypes.c_int64 * 13

_lock = threading.Lock()
_door: ctypes.CDLL | None = None
_reason: str | None = None
_attention: AttentionDoor | None = None


def open_door() -> bool:
    """Build (once per machine) and load the door if it is not loaded, binding it to the
    C kernels; whether it is open now. Called by the op's Python kernel at its first
    call; never raises (why not is :func:`unavailable_reason`)."""
    global _door, _reason
    if _door is not None:
        return native.door_closed_reason() is None
    if _reason is not None:  # (tried once: a build that failed is not tried again)
        return False
    with _lock:
        if _door is None and _reason is None:
            _door, _reason = _loaded()
    return _door is not None and native.door_closed_reason() is None


def _loaded() -> tuple[ctypes.CDLL | None, str | None]:
    kernels = bindings.library()
    if isinstance(kernels, str):
        return None, kernels
    door = native.door_library()
    if isinstance(door, str):
        return None, door
    door.hwplug_op_door_bind.restype = ctypes.c_int
    door.hwplug_op_door_bind.argtypes = [ctypes.c_void_p] * 4
    door.hwplug_op_door_approve.restype = ctypes.c_int
    door.hwplug_op_door_approve.argtypes = [_FIELDS, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    door.hwplug_op_door_approved.restype = ctypes.c_int64
    door.hwplug_op_door_approved.argtypes = []
    door.hwplug_attention_door_available.restype = ctypes.c_int
    door.hwplug_attention_door_available.argtypes = []
    functions = (
        kernels.hwplug_linear,
        kernels.hwplug_linear_row_bf16,
        kernels.hwplug_linear_amx,
        kernels.hwplug_linear_dpbf16,
    )
    addresses = [ctypes.cast(f, ctypes.c_void_p) for f in functions]
    if door.hwplug_op_door_bind(*addresses) != 0:
        return None, "the op door is bound to another copy of the native kernels"
    return door, None


def active() -> bool:
    """Whether the door is loaded and open (it is never loaded by asking this)."""
    return _door is not None and native.door_closed_reason() is None


def unavailable_reason() -> str | None:
    """Why the door does not take calls now, or None when it does (loaded and open)."""
    closed = native.door_closed_reason()
    if closed is not None:
        return closed
    if _door is None:
        return _reason or "not loaded yet (the op's first call loads it)"
    return None


def approve(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    path: str | None,
    out: torch.dtype,
) -> bool:
    """Approve the layout of a call the Python door has just checked and computed with
    the kernel of ``path`` (None: the vector path), its result in ``out`` (float32, or
    bfloat16 on a pairs path); whether the door took it. Only a layout the door runs
    exactly as the Python door does may be approved: ``x`` and the weight with their
    last dimension contiguous, a float32 bias or none."""
    door = _door
    if door is None:
        return False
    fields = _FIELDS(
        _SCALAR_TYPES[x.dtype],
        _SCALAR_TYPES[weight.dtype],
        x.shape[0],
        x.shape[1],
        x.stride(0),
        x.stride(1),
        weight.shape[0],
        weight.shape[1],
        weight.stride(0),
        weight.stride(1),
        -1 if bias is None else _SCALAR_TYPES[bias.dtype],
        0 if bias is None else bias.shape[0],
        0 if bias is None else bias.stride(0),
    )
    kind = bindings.LINEAR_KINDS[weight.dtype]
    return door.hwplug_op_door_approve(fields, _PATHS[path], kind, _SCALAR_TYPES[out]) == 0


def approved_layouts() -> int:
    """How many layouts the door has approved in this process (0 where it is not loaded)."""
    door = _door
    return 0 if door is None else int(door.hwplug_op_door_approved())


# -- attention ----------------------------------------------------------------------------
_LAYER_FIELDS = ctypes.c_int64 * 66
_META_FIELDS = ctypes.c_int64 * 28
_COUNTS = ctypes.c_int64 * 4


def bound_attention_door() -> AttentionDoor | None:
    """The attention door once :func:`attention_door` has bound it, while the door is
    open; None otherwise (nothing is built or loaded by asking)."""
    door = _attention
    if door is None or native.door_closed_reason() is not None:
        return None
    return door


def attention_door(current_step: object) -> AttentionDoor | None:
    """The door of ``hwplug::unified_attention`` and ``..._with_output``
    (``csrc/attention_door.cpp``), opened (:func:`open_door`) and bound to the native
    decode kernel and to ``current_step``, the :class:`contextvars.ContextVar` whose value
    is the calling context's prepared step (``hwplug.attention``'s ``forward_context``);
    None where it is closed, cannot be built, or was built without Python's headers.
    Never raises."""
    global _attention
    if not open_door() or _door is None:
        return None
    if _attention is not None:
        return _attention if _attention.variable is current_step else None
    with _lock:
        if _attention is None and _door.hwplug_attention_door_available() == 1:
            _attention = AttentionDoor.bind(_door, current_step)
    return _attention if _attention is not None and _attention.variable is current_step else None


def _describe(fields: list[int], tensor: torch.Tensor | None) -> None:
    """A tensor's part of a layer's layout, as the door reads it: dtype, rank, four sizes
    and four strides (-1 past its rank; all -1 for none)."""
    if tensor is None:
        fields.extend([-1] * 10)
        return
    _describe_shape(fields, _SCALAR_TYPES[tensor.dtype], tensor, 4)


def _describe_meta(fields: list[int], tensor: torch.Tensor) -> None:
    """A metadata tensor as a ticket names it: its address, then its dtype, rank, two
    sizes and two strides."""
    fields.append(tensor.data_ptr())
    _describe_shape(fields, _INDEX_TYPES[tensor.dtype], tensor, 2)


def _describe_shape(fields: list[int], code: int, tensor: torch.Tensor, width: int) -> None:
    """``code`` (the dtype's), the rank, then ``width`` sizes and ``width`` strides (-1
    past the rank), as ``describe_shape`` in ``csrc/attention_door.cpp`` writes them."""
    pad = [-1] * (width - tensor.dim())
    fields.extend((code, tensor.dim(), *tensor.shape, *pad, *tensor.stride(), *pad))


_INDEX_TYPES = {torch.int32: 3, torch.int64: 4}
"""torch's C++ codes of the metadata's integer dtypes."""


class AttentionDoor:
    """The attention door's Python side: what hwplug.attention approves through it.

    Only the validated attention ops approve layers (:meth:`approve_layer`) and only
    the torch backend's ``prepare`` issues tickets (:meth:`issue`); see
    ``csrc/attention_door.cpp`` for what the door checks on every call.
    """

    def __init__(self, library: ctypes.CDLL, variable: object) -> None:
        self.library = library
        self.variable = variable

    @classmethod
    def bind(cls, door: ctypes.CDLL, variable: object) -> AttentionDoor | None:
        door.hwplug_attention_door_bind.restype = ctypes.c_int
        door.hwplug_attention_door_bind.argtypes = [ctypes.c_void_p, ctypes.py_object]
        door.hwplug_attention_door_approve.restype = ctypes.c_int
        door.hwplug_attention_door_approve.argtypes = [_LAYER_FIELDS, ctypes.c_char_p]
        door.hwplug_attention_door_issue.restype = ctypes.c_int
        pointer, integer = ctypes.c_void_p, ctypes.c_int64
        door.hwplug_attention_door_issue.argtypes = [
            *(integer, _META_FIELDS, pointer, integer, integer, pointer, pointer),
            *(integer, integer, integer, integer),
        ]
        door.hwplug_attention_door_revoke.restype = None
        door.hwplug_attention_door_revoke.argtypes = [ctypes.c_int64]
        door.hwplug_attention_door_counts.restype = None
        door.hwplug_attention_door_counts.argtypes = [_COUNTS]
        kernels = bindings.library()
        if isinstance(kernels, str):
            return None
        decode = ctypes.cast(kernels.hwplug_paged_decode, ctypes.c_void_p)
        if door.hwplug_attention_door_bind(decode, variable) != 0:
            return None
        return cls(door, variable)

    def approve_layer(
        self,
        tensors: tuple[torch.Tensor, ...],
        output: torch.Tensor | None,
        caches: tuple[torch.Tensor, torch.Tensor],
        scales: tuple[torch.Tensor, torch.Tensor],
        backend: str,
        scale: float,
        sliding_window: int | None,
    ) -> bool:
        """Approve the layout of an attention call the validated op has just checked and
        computed on the native decode path: ``tensors`` the query, key and value,
        ``output`` the buffer it wrote into (None: the op made its result), the caches,
        the two scale tensors, the backend's name, ``scale`` and ``sliding_window``.
        Whether the door took it."""
        fields: list[int] = []
        try:
            for tensor in (*tensors, output, *caches):
                _describe(fields, tensor)
            for tensor in scales:
                fields.extend((_SCALAR_TYPES[tensor.dtype], tensor.dim()))
        except KeyError:  # (a dtype the door never runs)
            return False
        fields.append(struct.unpack("q", struct.pack("d", float(scale)))[0])
        fields.append(-1 if sliding_window is None else int(sliding_window))
        name = backend.encode()
        return self.library.hwplug_attention_door_approve(_LAYER_FIELDS(*fields), name) == 0

    def issue(
        self,
        step: object,
        metadata: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
        table: torch.Tensor,
        lens: torch.Tensor,
        slots: torch.Tensor,
        *,
        num_blocks: int,
        block_size: int,
    ) -> bool:
        """Issue ``step``'s ticket: a prepared decode step whose sequences ``0..n-1`` each
        decode one token from query rows ``0..n-1`` (``n``: ``lens``'s length), with the
        four metadata tensors the op is given (``query_start_loc``, ``seq_lens``,
        ``block_table``, ``slot_mapping``), the int64 ``table`` (rows contiguous) and
        ``lens`` (contiguous) the kernel reads, which the door copies now, and the ``n``
        int64 ``slots`` its rows are stored at: the leading entries of ``slot_mapping``
        (the same memory, which the door reads only in calls given that very tensor). The
        ticket is revoked when ``step`` is freed. Whether the door took it."""
        fields: list[int] = []
        try:
            for tensor in metadata:
                _describe_meta(fields, tensor)
        except KeyError:
            return False
        key = id(step)
        issued = self.library.hwplug_attention_door_issue(
            key,
            _META_FIELDS(*fields),
            table.data_ptr(),
            table.stride(0),
            table.shape[1],
            lens.data_ptr(),
            slots.data_ptr(),
            lens.shape[0],
            metadata[3].shape[0],
            num_blocks,
            block_size,
        )
        if issued != 0:
            return False
        weakref.finalize(step, self.library.hwplug_attention_door_revoke, key)
        return True

    def counts(self) -> dict[str, int]:
        """Layers approved, tickets alive, calls the door served and calls it handed to
        the validated ops, in this process."""
        counts = _COUNTS()
        self.library.hwplug_attention_door_counts(counts)
        return dict(zip(("layers", "tickets", "served", "handed"), counts, strict=True))
