"""Writing keys and values into a paged KV cache and reading them back.

A cache tensor has the paged layout ``[num_blocks, block_size, num_kv_heads,
head_size]``; token ``i`` lives in slot ``slot_mapping[i]`` = ``block *
block_size + offset``, and a negative slot marks a padding token (skipped on
write, a zero row on gather). fp8 caches hold values divided by a per-tensor
scale; :func:`compute_kv_scales` derives that scale from the data, which is
how ``CacheConfig.calculate_kv_scales=True`` is served.

Two backends do the work: ``"torch"``, the pure-torch reference, and
``"triton"``, which runs on the devices of platforms that run Triton and, with
``TRITON_INTERPRET=1``, on CPU tensors through Triton's interpreter. For the
same input both store the same bytes (see :mod:`hwplug.kernels._triton_kv` for why that takes care).
"""

from __future__ import annotations

import importlib.util
import math
import numbers
import os
from typing import Literal

import torch

from hwplug.kernels import reference
from hwplug.kernels.checks import shares_memory
from hwplug.kernels.formats import CACHE_DTYPES, INPUT_DTYPES, fp8_format

__all__ = [
    "BACKENDS",
    "compute_kv_scales",
    "gather_kv_cache",
    "select_backend",
    "shares_memory",
    "TRITON_DEVICE_TYPES",
    "triton_unavailable_reason",
    "write_kv_cache",
]

Backend = Literal["auto", "torch", "triton"]
BACKENDS: tuple[str, ...] = ("auto", "torch", "triton")
"""The accepted values of the ``backend`` argument."""

_TRUE_WORDS = frozenset({"1", "true", "yes", "on", "y"})
_import_error: str | None = None


def _dtype_names(dtypes: tuple[torch.dtype, ...]) -> str:
    return ", ".join(str(d).removeprefix("torch.") for d in dtypes)


def _interpret_requested() -> bool:
    """Whether ``TRITON_INTERPRET`` asks for the interpreter right now (Triton's spelling)."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in _TRUE_WORDS


def _triton_import_problem() -> str | None:
    """Why triton cannot be imported, or None (a failure is remembered)."""
    global _import_error
    if _import_error is None:
        try:
            import hwplug.kernels._triton_kv  # noqa: F401
        except ModuleNotFoundError as exc:
            missing = (exc.name or "").partition(".")[0]
            if missing not in ("triton", "numpy"):
                raise
            _import_error = f"the {missing} package is not installed (pip install 'hwplug[triton]')"
        except Exception as exc:  # an installed but broken triton must not break "auto"
            _import_error = f"triton could not be imported ({type(exc).__name__}: {exc})"
        else:
            _import_error = ""
    return _import_error or None


TRITON_DEVICE_TYPES = frozenset({"cuda", "xpu"})
"""The torch device types Triton has a backend for (NVIDIA and AMD GPUs are ``cuda``
devices to torch, Intel GPUs ``xpu``): what :func:`triton_unavailable_reason` assumes
of a device when its caller does not say whether the platform runs Triton."""


def triton_unavailable_reason(
    device: torch.device | str, *, runs_triton: bool | None = None
) -> str | None:
    """Why the Triton kernels cannot run on tensors on ``device``, or None when they can.

    They run on the devices of a platform that runs Triton, and on CPU tensors,
    or such a platform's, in Triton's interpreter when ``TRITON_INTERPRET=1`` is
    set at the time of the call. ``runs_triton`` is the platform's answer for
    ``device`` (``Platform.runs_triton``: the attention backends pass their
    session's); None judges by device type (:data:`TRITON_DEVICE_TYPES`). The
    kernels never look the platform up themselves. Never initialises a device
    runtime.
    """
    device = torch.device(device)
    interpret = _interpret_requested()
    if device.type == "cpu":
        if not interpret:
            return (
                "the tensors are on the CPU and TRITON_INTERPRET is not set; set "
                "TRITON_INTERPRET=1 to run the kernels in Triton's interpreter"
            )
    else:
        runs = device.type in TRITON_DEVICE_TYPES if runs_triton is None else runs_triton
        if not runs:
            why = (
                f"Triton has no backend for {device.type} devices (it runs on "
                f"{', '.join(sorted(TRITON_DEVICE_TYPES))}; pass runs_triton=True for a "
                "platform that runs it)"
                if runs_triton is None
                else f"the platform of {device.type} tensors does not run Triton (its runs_triton)"
            )
            if interpret:
                return (
                    "Triton's interpreter (TRITON_INTERPRET=1) runs CPU tensors and those of "
                    f"a platform that runs Triton, not {device.type} tensors: {why}"
                )
            return f"the Triton kernels do not run on {device.type} tensors: {why}"
    if interpret and importlib.util.find_spec("numpy") is None:
        return "Triton's interpreter needs numpy, which is not installed"
    return _triton_import_problem()


def _check_backend_name(backend: object) -> None:
    if backend not in BACKENDS:
        raise ValueError(
            f"backend must be one of {', '.join(repr(b) for b in BACKENDS)}; got {backend!r}"
        )


def select_backend(
    backend: str, device: torch.device | str, *, runs_triton: bool | None = None
) -> Literal["torch", "triton"]:
    """The backend that will run for ``backend`` on tensors on ``device``.

    ``"auto"`` picks Triton where it can run (see :func:`triton_unavailable_reason`,
    which takes ``runs_triton``)
    and the torch reference elsewhere. ``"triton"`` where Triton cannot run is a
    ``RuntimeError`` saying why; an unknown name is a ``ValueError``.
    """
    _check_backend_name(backend)
    if backend == "torch":
        return "torch"
    reason = triton_unavailable_reason(device, runs_triton=runs_triton)
    if reason is None:
        return "triton"
    if backend == "triton":
        raise RuntimeError(f"backend='triton' cannot run here: {reason}; or use backend='torch'")
    return "torch"


# -- validation -----------------------------------------------------------------


def _check_tensor(name: str, t: object, ndim: int, layout: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of shape {layout}; got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must have shape {layout}; got shape {tuple(t.shape)}")
    return t


def _check_dtype(name: str, t: torch.Tensor, allowed: tuple[torch.dtype, ...]) -> None:
    if t.dtype not in allowed:
        raise ValueError(
            f"{name} dtype must be one of {_dtype_names(allowed)}; "
            f"got {str(t.dtype).removeprefix('torch.')}"
        )


def _scale_value(name: str, scale: object) -> float:
    """A scale as a Python float, checked to be positive and finite."""
    if isinstance(scale, torch.Tensor):
        if scale.numel() != 1:
            raise ValueError(
                f"{name} must be a number or a 0-d/1-element tensor; got a tensor of shape "
                f"{tuple(scale.shape)}"
            )
        if scale.dtype.is_complex or scale.dtype == torch.bool:
            raise ValueError(f"{name} must be a real number; got a {scale.dtype} tensor")
        value = float(scale.reshape(()).item())
    elif isinstance(scale, numbers.Real) and not isinstance(scale, bool):
        value = float(scale)
    else:
        raise ValueError(
            f"{name} must be a positive finite float or a 0-d/1-element tensor; "
            f"got {type(scale).__name__}"
        )
    if not math.isfinite(value) or value <= 0.0:
        raise ValueError(f"{name} must be a positive finite number; got {value!r}")
    return value


def _check_slots(slot_mapping: object, num_tokens: int | None) -> torch.Tensor:
    """Check the slot mapping; ``num_tokens`` None accepts any length."""
    if (
        not isinstance(slot_mapping, torch.Tensor)
        or slot_mapping.dim() != 1
        or slot_mapping.dtype.is_floating_point
        or slot_mapping.dtype.is_complex
        or slot_mapping.dtype == torch.bool
    ):
        got = (
            f"shape {tuple(slot_mapping.shape)}, dtype {slot_mapping.dtype}"
            if isinstance(slot_mapping, torch.Tensor)
            else type(slot_mapping).__name__
        )
        raise ValueError(f"slot_mapping must be a 1-D integer tensor; got {got}")
    if not slot_mapping.dtype.is_signed:
        raise ValueError(
            f"slot_mapping must be a signed integer tensor (int64 or int32: a negative slot "
            f"marks padding); got {slot_mapping.dtype}"
        )
    if num_tokens is not None and slot_mapping.shape[0] != num_tokens:
        raise ValueError(
            f"slot_mapping must hold one slot per token: length {num_tokens}; "
            f"got length {slot_mapping.shape[0]}"
        )
    return slot_mapping


def _check_slot_range(slot_mapping: torch.Tensor, cache_shape: tuple[int, ...]) -> None:
    """Reject slots beyond the cache (reads one value back from the device)."""
    num_slots = cache_shape[0] * cache_shape[1]
    if slot_mapping.numel():
        top = int(slot_mapping.max().item())
        if top >= num_slots:
            raise ValueError(
                f"slot_mapping holds slot {top}, but the cache has {num_slots} slots "
                f"(num_blocks={cache_shape[0]} x block_size={cache_shape[1]}); slots must be "
                f"below {num_slots} (a negative slot marks padding)"
            )


def _check_caches(key_cache: object, value_cache: object) -> tuple[torch.Tensor, torch.Tensor]:
    layout = "[num_blocks, block_size, num_kv_heads, head_size]"
    kc = _check_tensor("key_cache", key_cache, 4, layout)
    vc = _check_tensor("value_cache", value_cache, 4, layout)
    if kc.shape != vc.shape:
        raise ValueError(
            f"value_cache shape {tuple(vc.shape)} must equal key_cache shape {tuple(kc.shape)}"
        )
    _check_dtype("key_cache", kc, CACHE_DTYPES)
    _check_dtype("value_cache", vc, CACHE_DTYPES)
    return kc, vc


def _check_same_device(**tensors: torch.Tensor) -> torch.device:
    devices = {name: t.device for name, t in tensors.items()}
    first = next(iter(devices.values()))
    if any(d != first for d in devices.values()):
        listing = ", ".join(f"{name} on {d}" for name, d in devices.items())
        raise ValueError(f"all tensors must be on one device; got {listing}")
    return first


# -- public API ----------------------------------------------------------------------


def compute_kv_scales(
    key: torch.Tensor, value: torch.Tensor, fp8_dtype: torch.dtype | str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor fp8 scales for ``key`` and ``value``: amax / the format's largest value.

    The largest finite values are 448 (``float8_e4m3fn``), 240
    (``float8_e4m3fnuz``) and 57344 (``float8_e5m2``, ``float8_e5m2fnuz``).
    Returns two 0-d float32 tensors on the inputs' device (no host sync); an
    all-zero (or empty) input gives 1.0. This serves
    ``CacheConfig.calculate_kv_scales=True``. Non-finite inputs give a
    non-finite scale, which :func:`write_kv_cache` rejects.
    """
    if isinstance(fp8_dtype, str):
        name = fp8_dtype.removeprefix("torch.")
        candidate = getattr(torch, name, None)
        fp8_dtype = candidate if isinstance(candidate, torch.dtype) else fp8_dtype
    fmt = fp8_format(fp8_dtype)  # type: ignore[arg-type]
    scales = []
    for name, t in (("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor; got {type(t).__name__}")
        if not t.dtype.is_floating_point:
            raise ValueError(f"{name} must be a floating-point tensor; got {t.dtype}")
        if t.numel() == 0:
            scales.append(torch.ones((), dtype=torch.float32, device=t.device))
            continue
        amax = t.detach().abs().amax().to(torch.float32)
        scale = amax / fmt.max_finite
        # `amax == 0` rather than `amax > 0`: NaN must give a NaN scale, not 1.0
        scales.append(torch.where(amax == 0, torch.ones_like(scale), scale))
    return scales[0], scales[1]


def write_kv_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: float | torch.Tensor = 1.0,
    v_scale: float | torch.Tensor = 1.0,
    *,
    backend: Backend = "auto",
    runs_triton: bool | None = None,
) -> None:
    """Store ``key[i]`` and ``value[i]`` in slot ``slot_mapping[i]`` of the caches.

    ``key`` and ``value`` are ``[num_tokens, num_kv_heads, head_size]`` in
    bfloat16, float16 or float32; the caches are ``[num_blocks, block_size,
    num_kv_heads, head_size]`` in an fp8 format (see
    :data:`~hwplug.kernels.formats.FP8_FORMATS`), bfloat16, float16 or float32.
    An fp8 cache stores each value divided by its scale in fp32, saturated to
    the format's finite range and rounded to nearest even (NaN stays NaN); any
    other cache stores a plain cast and ignores the scales (which must still be
    positive and finite). Negative slots are skipped.

    ``backend``: ``"torch"``, ``"triton"`` or ``"auto"`` (see
    :func:`select_backend`). Bad arguments raise ``ValueError`` naming the
    argument. Checking the slot range reads one value back from the device.
    """
    _check_backend_name(backend)
    layout = "[num_tokens, num_kv_heads, head_size]"
    k = _check_tensor("key", key, 3, layout)
    v = _check_tensor("value", value, 3, layout)
    if k.shape != v.shape:
        raise ValueError(f"value shape {tuple(v.shape)} must equal key shape {tuple(k.shape)}")
    _check_dtype("key", k, INPUT_DTYPES)
    _check_dtype("value", v, INPUT_DTYPES)
    kc, vc = _check_caches(key_cache, value_cache)
    if shares_memory(kc, vc):
        raise ValueError(
            "key_cache and value_cache share memory (the same tensor, or overlapping views of "
            "one); keys and values need separate caches"
        )
    if kc.shape[2:] != k.shape[1:]:
        raise ValueError(
            f"key and value have [num_kv_heads, head_size] = {tuple(k.shape[1:])}, which does "
            f"not match the caches' {tuple(kc.shape[2:])}"
        )
    slots = _check_slots(slot_mapping, k.shape[0])
    device = _check_same_device(key=k, value=v, key_cache=kc, value_cache=vc, slot_mapping=slots)
    _check_slot_range(slots, tuple(kc.shape))
    ks = _scale_value("k_scale", k_scale)
    vs = _scale_value("v_scale", v_scale)
    runner = select_backend(backend, device, runs_triton=runs_triton)
    if runner == "torch":
        reference.write_rows(k, kc, slots, ks)
        reference.write_rows(v, vc, slots, vs)
        return
    # lazy: triton loads only when a Triton kernel runs
    from hwplug.kernels import _triton_kv

    interpret = _interpret_requested()
    slots = slots.contiguous()
    _triton_kv.write_rows(k, kc, slots, ks, interpret=interpret)
    _triton_kv.write_rows(v, vc, slots, vs, interpret=interpret)


def gather_kv_cache(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: float | torch.Tensor = 1.0,
    v_scale: float | torch.Tensor = 1.0,
    *,
    dtype: torch.dtype,
    backend: Backend = "auto",
    runs_triton: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Read slots ``slot_mapping`` of the caches back: the inverse of :func:`write_kv_cache`.

    Returns ``(key, value)``, each ``[len(slot_mapping), num_kv_heads,
    head_size]`` in ``dtype`` (bfloat16, float16 or float32), with zero rows for
    negative slots. fp8 values are multiplied by their scale in fp32 and then
    cast; other caches are cast as they are.
    """
    _check_backend_name(backend)
    kc, vc = _check_caches(key_cache, value_cache)
    if not isinstance(dtype, torch.dtype) or dtype not in INPUT_DTYPES:
        raise ValueError(f"dtype must be one of {_dtype_names(INPUT_DTYPES)}; got {dtype!r}")
    slots = _check_slots(slot_mapping, None)
    device = _check_same_device(key_cache=kc, value_cache=vc, slot_mapping=slots)
    _check_slot_range(slots, tuple(kc.shape))
    ks = _scale_value("k_scale", k_scale)
    vs = _scale_value("v_scale", v_scale)
    runner = select_backend(backend, device, runs_triton=runs_triton)
    if runner == "torch":
        return (
            reference.gather_rows(kc, slots, ks, dtype),
            reference.gather_rows(vc, slots, vs, dtype),
        )
    # lazy: triton loads only when a Triton kernel runs
    from hwplug.kernels import _triton_kv

    interpret = _interpret_requested()
    slots = slots.contiguous()
    return (
        _triton_kv.gather_rows(kc, slots, ks, dtype, interpret=interpret),
        _triton_kv.gather_rows(vc, slots, vs, dtype, interpret=interpret),
    )
