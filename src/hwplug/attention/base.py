"""The attention-backend contract: what a backend can serve, and how it is called.

A backend is a subclass of :class:`AttentionBackend`. Its class attributes
say, as data, which models, caches and devices it serves; the generic
:meth:`AttentionBackend.problem` reads them, so most backends never override
it. An instance is bound to one layer's head layout and runs
:meth:`AttentionBackend.forward` once per step.

Importing this module and calling :meth:`~AttentionBackend.problem` never
imports torch (resolution runs torch-free); the constructor and
:meth:`~AttentionBackend.forward` import it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
from collections.abc import Collection
from typing import TYPE_CHECKING, Any, ClassVar

from hwplug.attention.call import AttentionCall
from hwplug.attention.metadata import AttentionMetadata, PreparedStep, metadata_of
from hwplug.core.graphs import AttentionGraphSupport

if TYPE_CHECKING:
    import torch

    from hwplug.core.config import EngineConfig
    from hwplug.core.platform import Platform

__all__ = [
    "ANY_PLATFORM",
    "CACHE_DTYPE_NAMES",
    "AttentionBackend",
    "PreparedStep",
    "describe_platforms",
    "describe_sizes",
    "metadata_of",
]

CACHE_DTYPE_NAMES: dict[str, str | None] = {
    "auto": None,
    "bfloat16": "bfloat16",
    "float16": "float16",
    "float32": "float32",
    "fp8_e4m3": "float8_e4m3fn",
    "fp8_e5m2": "float8_e5m2",
}
"""Platform-independent ``cache_dtype`` strings -> torch dtype names (``auto``: the query's)."""

_INPUT_DTYPE_NAMES = ("bfloat16", "float16", "float32")


def describe_sizes(sizes: Collection[int]) -> str:
    """Say which sizes ``sizes`` holds: ``"every multiple of 16 from 32 to 256"``, ``"8, 16"``."""
    if isinstance(sizes, range) and len(sizes) > 2:
        last = sizes[-1]
        if sizes.step == 1:
            return f"every size from {sizes.start} to {last}"
        if sizes.start % sizes.step == 0:
            return f"every multiple of {sizes.step} from {sizes.start} to {last}"
        return f"every {sizes.step}th size from {sizes.start} to {last}"
    return ", ".join(str(s) for s in sorted(sizes))


ANY_PLATFORM = "*"
"""In :attr:`AttentionBackend.platforms`: every platform."""


def describe_platforms(names: Collection[str]) -> str:
    """``"platform 'npu' only"``, ``"platforms 'npu' and 'vela' only"``, ``"every platform"``."""
    if ANY_PLATFORM in names:
        return "every platform"
    quoted = [repr(n) for n in sorted(names)]
    if not quoted:
        return "no platform"
    if len(quoted) == 1:
        return f"platform {quoted[0]} only"
    return f"platforms {', '.join(quoted[:-1])} and {quoted[-1]} only"


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) < 1:
        raise ValueError(f"{name} must be a positive integer; got {value!r}")
    return int(value)


class AttentionBackend:
    """Base class of every attention backend.

    Subclasses set :attr:`name` and :attr:`graph_support`, describe what they
    serve with the rule attributes below (``None`` means "no restriction"),
    and implement :meth:`attend`. :meth:`problem` and :meth:`forward` are
    generic; override :meth:`problem` (calling ``super()``) only for rules
    that are not data.
    """

    # -- identity ------------------------------------------------------------
    name: ClassVar[str] = ""
    """Unique lower-case name, the value of ``attention.backend``."""
    graph_support: ClassVar[AttentionGraphSupport] = AttentionGraphSupport.NEVER
    """How much of a batch can run inside a full device graph."""

    _checked_metadata: tuple[AttentionMetadata, int] | None = None
    """The metadata :meth:`check_inputs` last checked, and for how many rows: the layers
    of a step share one frozen metadata, checked for the first of them."""

    # -- what the backend serves (data read by problem()) --------------------
    platforms: ClassVar[tuple[str, ...] | None] = None
    """Names of the platforms it serves (``Platform.name``, such as ``("npu",)``);
    ``("*",)`` is every platform. None: for a built-in backend, every platform; for a
    plugin's backend, the platforms its own distribution provides (every platform when
    it provides none), as the session's backend table decides (:class:`BackendTable`)."""
    device_types: ClassVar[tuple[str, ...] | None] = None
    """torch device types it runs on (``platform.device_type``); None: every one."""
    uses_triton: ClassVar[bool] = False
    """Whether it runs Triton kernels: then it serves only the platforms that run
    Triton (``platform.runs_triton``)."""
    head_sizes: ClassVar[Collection[int] | None] = None
    """Head sizes it serves (a ``range`` reads well in messages); None: any."""
    model_dtypes: ClassVar[tuple[str, ...] | None] = None
    """Model dtypes (``bfloat16``, ``float16``, ``float32``); None: any."""
    cache_dtypes: ClassVar[tuple[str, ...] | None] = None
    """``cache.cache_dtype`` strings it reads; None: every one the platform stores."""
    block_sizes: ClassVar[Collection[int] | None] = None
    """``cache.block_size`` values it serves; None: any."""
    supports_mla: ClassVar[bool] = False
    """Whether it serves multi-head latent attention models (``model.use_mla``)."""
    supports_sliding_window: ClassVar[bool] = True
    """Whether it serves sliding-window models (``model.sliding_window``)."""

    # -- selection -------------------------------------------------------------
    @classmethod
    def problem(cls, config: EngineConfig, platform: Platform) -> str | None:
        """Why this backend cannot serve ``config`` on ``platform``, or None when it can.

        One sentence naming the field (``model.head_size=80``) and what the
        backend allows. Never imports torch and never touches a device.
        """
        model, cache = config.model, config.cache
        who = f"the {cls.name} attention backend"
        scope = cls.platforms
        if scope is not None and ANY_PLATFORM not in scope and platform.name not in scope:
            return (
                f"{who} serves {describe_platforms(scope)}; {platform.describe_device()} is "
                f"platform {platform.name!r}"
            )
        if model.use_mla and not cls.supports_mla:
            return (
                f"model.use_mla=True: {who} does not serve multi-head latent attention (MLA) models"
            )
        if cls.device_types is not None and platform.device_type not in cls.device_types:
            return (
                f"{who} runs on {' and '.join(cls.device_types)} devices; "
                f"{platform.describe_device()} is a {platform.device_type or 'non-torch'} device"
            )
        if cls.uses_triton and not platform.runs_triton:
            return (
                f"{who} runs Triton kernels, and {platform.describe_device()} (a "
                f"{platform.device_type or 'non-torch'} device) does not run Triton: its "
                "platform's runs_triton is False"
            )
        if cls.head_sizes is not None and model.head_size not in cls.head_sizes:
            return (
                f"model.head_size={model.head_size} is not served by {who}; it serves "
                f"{describe_sizes(cls.head_sizes)}"
            )
        dtype: str = model.dtype
        if dtype == "auto":
            preferred = platform.supported_model_dtypes()
            dtype = preferred[0] if preferred else dtype
        if cls.model_dtypes is not None and dtype not in cls.model_dtypes:
            return (
                f"model.dtype={model.dtype!r} is not served by {who}; it serves "
                f"{', '.join(cls.model_dtypes)}"
            )
        if cls.cache_dtypes is not None and cache.cache_dtype not in cls.cache_dtypes:
            return (
                f"cache.cache_dtype={cache.cache_dtype!r} is not read by {who}; it reads "
                f"{', '.join(cls.cache_dtypes)}"
            )
        block_size = cache.block_size  # None: not chosen yet, nothing to refuse
        if (
            cls.block_sizes is not None
            and block_size is not None
            and block_size not in cls.block_sizes
        ):
            return (
                f"cache.block_size={block_size} is not served by {who}; it serves "
                f"{describe_sizes(cls.block_sizes)}"
            )
        if model.sliding_window is not None and not cls.supports_sliding_window:
            return (
                f"model.sliding_window={model.sliding_window}: {who} does not serve "
                "sliding-window attention; it needs model.sliding_window=None"
            )
        return None

    # -- instance state (set by __init__) ------------------------------------------
    num_heads: int
    head_size: int
    num_kv_heads: int
    scale: float
    sliding_window: int | None
    cache_dtype: torch.dtype | None

    # -- construction ----------------------------------------------------------
    def __init__(
        self,
        num_heads: int,
        head_size: int,
        num_kv_heads: int,
        scale: float,
        *,
        sliding_window: int | None = None,
        cache_dtype: str | torch.dtype = "auto",
    ) -> None:
        """Bind the backend to one layer's head layout.

        ``scale`` multiplies the query-key products (usually ``head_size ** -0.5``);
        ``sliding_window`` limits each query to the last that many positions;
        ``cache_dtype`` is the dtype the caches passed to :meth:`forward` have:
        a torch dtype or one of ``auto`` (the query's dtype), ``bfloat16``,
        ``float16``, ``float32``, ``fp8_e4m3`` (``float8_e4m3fn``), ``fp8_e5m2``.

        :raises ValueError: an argument is invalid (the message names it).
        """
        self.num_heads = _positive_int("num_heads", num_heads)
        self.head_size = _positive_int("head_size", head_size)
        self.num_kv_heads = _positive_int("num_kv_heads", num_kv_heads)
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads}): each key/value head serves a group of query heads"
            )
        if self.head_sizes is not None and self.head_size not in self.head_sizes:
            raise ValueError(
                f"head_size={self.head_size} is not served by the {self.name} attention "
                f"backend; it serves {describe_sizes(self.head_sizes)}"
            )
        if (
            isinstance(scale, bool)
            or not isinstance(scale, numbers.Real)
            or not math.isfinite(float(scale))
            or float(scale) <= 0
        ):
            raise ValueError(f"scale must be a positive finite number; got {scale!r}")
        self.scale = float(scale)
        if sliding_window is not None:
            sliding_window = _positive_int("sliding_window", sliding_window)
        self.sliding_window = sliding_window
        # None: the query's dtype (cache_dtype="auto")
        self.cache_dtype = self._parse_cache_dtype(cache_dtype)

    def _parse_cache_dtype(self, cache_dtype: object) -> torch.dtype | None:
        import torch

        # lazy: torch; `import hwplug` (which lists the backends) stays light
        from hwplug.kernels.formats import CACHE_DTYPES

        allowed_names = ", ".join(CACHE_DTYPE_NAMES)
        if isinstance(cache_dtype, str):
            if cache_dtype not in CACHE_DTYPE_NAMES:
                hint = ""
                if cache_dtype.startswith("fp8"):
                    hint = (
                        "; the meaning of 'fp8' depends on the platform: pass "
                        "hwplug.core.kv_cache.cache_dtype_to_torch(...) of the resolved config"
                    )
                raise ValueError(
                    f"cache_dtype={cache_dtype!r} is not a cache dtype; use a torch dtype or "
                    f"one of {allowed_names}{hint}"
                )
            name = CACHE_DTYPE_NAMES[cache_dtype]
            return None if name is None else getattr(torch, name)
        if isinstance(cache_dtype, torch.dtype) and cache_dtype in CACHE_DTYPES:
            return cache_dtype
        allowed = ", ".join(str(d).removeprefix("torch.") for d in CACHE_DTYPES)
        raise ValueError(
            f"cache_dtype={cache_dtype!r} is not a KV-cache dtype; use one of the torch dtypes "
            f"{allowed} or one of {allowed_names}"
        )

    def __repr__(self) -> str:
        window = f", sliding_window={self.sliding_window}" if self.sliding_window else ""
        dtype = "auto" if self.cache_dtype is None else str(self.cache_dtype).removeprefix("torch.")
        return (
            f"{type(self).__name__}(num_heads={self.num_heads}, head_size={self.head_size}, "
            f"num_kv_heads={self.num_kv_heads}, scale={self.scale:g}{window}, "
            f"cache_dtype={dtype})"
        )

    # -- running ---------------------------------------------------------------
    @classmethod
    def prepare(cls, metadata: AttentionMetadata, *, num_blocks: int, block_size: int) -> Any:
        """Work out what this backend needs for one step, once, before the first layer.

        ``num_blocks`` and ``block_size`` describe the KV caches the step's
        layers pass to :meth:`forward`. Checks the metadata's values against
        them (from its host values; metadata made from device tensors alone is
        read back here, once) and returns what every layer's :meth:`forward`
        takes in place of the metadata. The default returns the metadata
        itself; a backend that derives per-step structures (gather indices,
        masks, launch parameters) returns a :class:`PreparedStep`.

        :raises ValueError: a value that does not fit the cache or the lengths
            (naming the field and the sequence).
        """
        _positive_int("num_blocks", num_blocks)
        _positive_int("block_size", block_size)

        if not isinstance(metadata, AttentionMetadata):
            raise ValueError(
                f"metadata must be an AttentionMetadata; got {type(metadata).__name__}"
            )
        metadata.check_values(num_blocks, block_size)
        return metadata

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        metadata: Any,
        *,
        k_scale: float | torch.Tensor = 1.0,
        v_scale: float | torch.Tensor = 1.0,
    ) -> torch.Tensor:
        """Write this step's keys and values to the caches, then attend.

        ``query`` is ``[N, num_heads, head_size]``, ``key`` and ``value``
        ``[N, num_kv_heads, head_size]``, the caches ``[num_blocks,
        block_size, num_kv_heads, head_size]`` in the cache dtype. Rows past
        ``T = metadata.query_start_loc[-1]`` are padding (slot -1): not
        written, their output rows unspecified. fp8 caches are quantised and
        dequantised with ``k_scale``/``v_scale`` (floats or 0-d float32
        tensors; a tensor is not read back to the host). Returns ``[N,
        num_heads, head_size]`` in the query's dtype.

        ``metadata`` is what :meth:`prepare` returned for this step (reads
        nothing back from the device), or an :class:`AttentionMetadata`, which
        a backend with its own :meth:`prepare` then prepares on the spot.

        :raises ValueError: an argument has the wrong type, shape, dtype or
            device, or a step prepared for another cache (the message names it).
        """

        return self.forward_call(
            AttentionCall(query, key, value, key_cache, value_cache, metadata, k_scale, v_scale)
        )

    def forward_call(self, call: AttentionCall) -> torch.Tensor:
        """:meth:`forward` with its arguments in one :class:`~hwplug.attention.AttentionCall`.

        :raises ValueError: as :meth:`forward`.
        """
        self.check_inputs(call)
        step = self._step(call.step, call.key_cache)
        check_scale("k_scale", call.k_scale, call.query)
        check_scale("v_scale", call.v_scale, call.query)
        if step is not call.step:
            call = dataclasses.replace(call, step=step)
        return self.attend(call)

    def _step(self, metadata: Any, key_cache: Any) -> Any:
        """The prepared step :meth:`attend` takes, preparing raw metadata when this
        backend prepares anything beyond the metadata itself."""
        import torch

        if isinstance(metadata, PreparedStep):
            if isinstance(key_cache, torch.Tensor) and key_cache.dim() == 4:
                geometry = (int(key_cache.shape[0]), int(key_cache.shape[1]))
                if geometry != (metadata.num_blocks, metadata.block_size):
                    raise ValueError(
                        f"the step was prepared for a cache of {metadata.num_blocks} blocks of "
                        f"{metadata.block_size}; key_cache has {geometry[0]} blocks of "
                        f"{geometry[1]}"
                    )
            return metadata
        if not isinstance(metadata, AttentionMetadata):
            raise ValueError(
                "metadata must be an AttentionMetadata or what prepare() returned; got "
                f"{type(metadata).__name__}"
            )
        own_prepare = type(self).prepare.__func__ is not AttentionBackend.prepare.__func__  # type: ignore[attr-defined]
        if own_prepare and isinstance(key_cache, torch.Tensor) and key_cache.dim() == 4:
            metadata.check()
            return type(self).prepare(
                metadata, num_blocks=int(key_cache.shape[0]), block_size=int(key_cache.shape[1])
            )
        return metadata

    def attend(self, call: AttentionCall) -> torch.Tensor:
        """The backend's work, called by :meth:`forward` with checked arguments;
        ``call.step`` is the prepared step (:meth:`prepare`'s result)."""
        raise NotImplementedError(f"{type(self).__name__} must implement attend()")

    def check_inputs(self, call: AttentionCall) -> None:
        """Check types, shapes, dtypes and devices of a call's tensors.

        Reads no tensor values (safe inside graph capture).

        :raises ValueError: the first problem found, naming the argument.
        """

        # lazy: torch; `import hwplug` (which lists the backends) stays light
        from hwplug.kernels.paged_kv import shares_memory

        query, key, value = call.query, call.key, call.value
        key_cache, value_cache, metadata = call.key_cache, call.value_cache, call.metadata

        h, kvh, d = self.num_heads, self.num_kv_heads, self.head_size
        _check_tensor("query", query, (None, h, d), "[num_tokens, num_heads, head_size]")
        n = query.shape[0]
        layout = "[num_tokens, num_kv_heads, head_size]"
        _check_tensor("key", key, (n, kvh, d), layout)
        _check_tensor("value", value, (n, kvh, d), layout)
        if query.dtype not in _input_dtypes():
            raise ValueError(
                f"query dtype must be one of {', '.join(_INPUT_DTYPE_NAMES)}; got "
                f"{_dtype_name(query.dtype)}"
            )
        for name, t in (("key", key), ("value", value)):
            if t.dtype != query.dtype:
                raise ValueError(
                    f"{name} dtype must equal the query's ({_dtype_name(query.dtype)}); got "
                    f"{_dtype_name(t.dtype)}"
                )
        cache_layout = "[num_blocks, block_size, num_kv_heads, head_size]"
        _check_tensor("key_cache", key_cache, (None, None, kvh, d), cache_layout)
        _check_tensor("value_cache", value_cache, tuple(key_cache.shape), cache_layout)
        want = self.cache_dtype if self.cache_dtype is not None else query.dtype
        for name, t in (("key_cache", key_cache), ("value_cache", value_cache)):
            if t.dtype != want:
                origin = "the query's dtype (cache_dtype='auto')"
                if self.cache_dtype is not None:
                    origin = "the backend's cache_dtype"
                raise ValueError(
                    f"{name} dtype must be {_dtype_name(want)}, {origin}; got "
                    f"{_dtype_name(t.dtype)}"
                )
        if shares_memory(key_cache, value_cache):
            raise ValueError(
                "key_cache and value_cache share memory; they must be separate tensors"
            )
        if not isinstance(metadata, AttentionMetadata):
            raise ValueError(
                "metadata must be an AttentionMetadata or what prepare() returned; got "
                f"{type(metadata).__name__}"
            )
        # a step's layers share its metadata, which is frozen: checked for the first of them
        checked = self._checked_metadata
        if checked is None or checked[0] is not metadata or checked[1] != n:
            metadata.check(num_tokens=n)
            self._checked_metadata = (metadata, n)  # (one attribute: threads see either)
        device = query.device
        if not (
            key.device == device
            and value.device == device
            and key_cache.device == device
            and value_cache.device == device
            and metadata.query_start_loc.device == device
        ):
            devices = {
                "query": query.device,
                "key": key.device,
                "value": value.device,
                "key_cache": key_cache.device,
                "value_cache": value_cache.device,
                "metadata": metadata.query_start_loc.device,
            }
            listing = ", ".join(f"{k} on {v}" for k, v in devices.items())
            raise ValueError(f"all tensors must be on one device; got {listing}")


@functools.cache
def _input_dtypes() -> tuple[torch.dtype, ...]:
    import torch

    return tuple(getattr(torch, name) for name in _INPUT_DTYPE_NAMES)


def _dtype_name(dtype: object) -> str:
    return str(dtype).removeprefix("torch.")


def _check_tensor(name: str, t: object, shape: tuple[int | None, ...], layout: str) -> None:
    import torch

    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of shape {layout}; got {type(t).__name__}")
    got = t.shape
    wrong = len(got) != len(shape)
    if not wrong:
        for size, want in zip(got, shape):
            if want is not None and size != want:
                wrong = True
    if wrong:
        expected = ", ".join("*" if s is None else str(s) for s in shape)
        raise ValueError(f"{name} must have shape {layout} = [{expected}]; got {list(t.shape)}")


def check_scale(name: str, scale: object, query: torch.Tensor) -> None:
    """A scale is a positive finite float, or a 1-element float32 tensor (not read)."""
    import torch

    if isinstance(scale, torch.Tensor):
        if scale.numel() != 1 or scale.dtype != torch.float32:
            raise ValueError(
                f"{name} must be a float or a 0-d float32 tensor; got a {_dtype_name(scale.dtype)} "
                f"tensor of shape {list(scale.shape)}"
            )
        if scale.device != query.device and scale.device.type != "cpu":
            raise ValueError(
                f"{name} must be on the query's device ({query.device}) or on the CPU; got "
                f"{scale.device}"
            )
        return
    if (
        isinstance(scale, bool)
        or not isinstance(scale, numbers.Real)
        or not math.isfinite(float(scale))
        or float(scale) <= 0
    ):
        raise ValueError(
            f"{name} must be a positive finite float or a 0-d float32 tensor; got {scale!r}"
        )
