"""The C++ door of ``hwplug::native_linear``: a compiled step without per-call Python.

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
import threading

import torch

from hwplug.kernels import bindings, native

__all__ = ["active", "approve", "approved_layouts", "open_door", "unavailable_reason"]

_SCALAR_TYPES = {torch.float16: 5, torch.float32: 6, torch.float64: 7, torch.bfloat16: 15}
"""torch's C++ codes (``c10::ScalarType``) of the dtypes a layout names."""
_PATHS = {None: 0, "row": 1, "amx": 2, "dpbf16": 3}
"""The door's code for each kernel path (:func:`hwplug.kernels.cpu_linear.pairs_path`)."""
_FIELDS = ctypes.c_int64 * 13

_lock = threading.Lock()
_door: ctypes.CDLL | None = None
_reason: str | None = None


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
