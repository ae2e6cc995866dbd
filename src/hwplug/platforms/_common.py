"""Helpers shared by the built-in platform modules.

Small pieces that several platforms need: which cache dtypes are fp8, how a
rejected cache or model dtype is explained (always with the exact value that
would work), filling a field only when the user left it unset, and querying a
vendor management library without letting its failures escape.

Nothing here imports torch.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from hwplug.core.dtypes import canonical_dtype
from hwplug.core.errors import ConfigError
from hwplug.core.platform import DeviceCapability, DeviceInfo, Platform

if TYPE_CHECKING:
    from hwplug.core.config import EngineConfig
    from hwplug.core.resolve import ChangeLog

__all__ = [
    "FP8_CACHE_DTYPES",
    "BuiltinPlatform",
    "QueryCache",
    "cache_dtype_message",
    "cache_dtype_problem_for",
    "fill_unset",
    "gfx_arch_name",
    "gfx_capability",
    "gfx_version",
    "is_fp8_cache",
    "model_dtype_message",
    "query_quietly",
    "quote_choices",
    "torch_cuda_query",
    "torch_version",
]

logger = logging.getLogger("hwplug.platforms")

T = TypeVar("T")

FP8_CACHE_DTYPES = frozenset({"fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc"})
"""Cache-dtype strings that store the KV cache in 8-bit floats."""


def is_fp8_cache(cache_dtype: str) -> bool:
    """Whether ``cache_dtype`` is one of the fp8 KV-cache formats."""
    return cache_dtype in FP8_CACHE_DTYPES


def quote_choices(values: Iterable[str], field: str) -> str:
    """``field='a'``, or ``field='a' or 'b'`` for several choices."""
    quoted = [repr(v) for v in values]
    if not quoted:
        return "nothing"
    if len(quoted) == 1:
        return f"{field}={quoted[0]}"
    return f"{field}={', '.join(quoted[:-1])} or {quoted[-1]}"


def suggested_cache_dtypes(rejected: str, usable: Iterable[str]) -> list[str]:
    """The cache dtypes to suggest instead of ``rejected``.

    For a rejected fp8 format: the fp8 formats the device can store, named
    exactly (``fp8_e5m2`` rather than the ``fp8`` alias). Otherwise, and when
    no fp8 format works: the non-fp8 choices.
    """
    usable = list(usable)
    if is_fp8_cache(rejected):
        named = [d for d in usable if is_fp8_cache(d) and d != "fp8" and d != rejected]
        if named:
            return named
        if "fp8" in usable and rejected != "fp8":
            return ["fp8"]
    return [d for d in usable if not is_fp8_cache(d) and d != rejected]


def cache_dtype_message(
    platform: Platform, cache_dtype: str, why: str, usable: Iterable[str]
) -> str:
    """The error text for a cache dtype ``platform`` cannot store.

    Names the option, the device, the reason ``why`` and the exact values
    that work (chosen from ``usable``).
    """
    choices = suggested_cache_dtypes(cache_dtype, usable)
    return (
        f"cache.cache_dtype={cache_dtype!r} is not supported on {platform.describe_device()}: "
        f"{why}; use {quote_choices(choices, 'cache.cache_dtype')}"
    )


def cache_dtype_problem_for(
    platform: Platform, cache_dtype: str, obstacle: Callable[[str], str | None]
) -> str | None:
    """A platform's ``cache_dtype_problem`` built from its table and ``obstacle``.

    ``obstacle(dtype)`` says why this device cannot store ``dtype`` (None when
    it can, or when it has nothing specific to say about a dtype outside the
    platform's ``cache_dtypes`` table). Dtypes outside the table are always
    rejected (``fp8_inc`` as the Gaudi format). The message suggests the
    values that work on this device.
    """
    why = obstacle(cache_dtype)
    if why is None and cache_dtype not in platform.cache_dtypes:
        if cache_dtype == "fp8_inc":
            why = "fp8_inc is the Intel Gaudi (HPU) format"
        else:
            why = f"the {platform.name} platform does not store {cache_dtype} KV caches"
    if why is None:
        return None
    usable = [d for d in platform.cache_dtypes if obstacle(d) is None]
    return cache_dtype_message(platform, cache_dtype, why, usable)


def model_dtype_message(platform: Platform, dtype: str, why: str, usable: Iterable[str]) -> str:
    """The error text for a model dtype ``platform`` cannot run, suggesting ``usable``."""
    return (
        f"model.dtype={dtype!r} is not supported on {platform.describe_device()}: {why}; "
        f"use {quote_choices(list(usable), 'model.dtype')}"
    )


def fill_unset(changes: ChangeLog, path: str, value: Any, reason: str) -> bool:
    """Record ``value`` at ``path`` unless the user set that field; True if filled."""
    if changes.was_set(path):
        return False
    changes.record(path, value, reason)
    return True


_GFX = re.compile(r"^gfx(\d{1,2})([0-9a-f])([0-9a-f])$")


def gfx_version(arch: str | None) -> tuple[int, int, int] | None:
    """``"gfx90a"`` -> ``(9, 0, 10)``; ``"gfx1100"`` -> ``(11, 0, 0)``; None if not a gfx name.

    Feature suffixes such as ``gfx942:sramecc+:xnack-`` are ignored.
    """
    if not arch:
        return None
    base = arch.strip().lower().split(":", 1)[0]
    match = _GFX.match(base)
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2), 16), int(match.group(3), 16)


def gfx_arch_name(target: object) -> str | None:
    """A gfx arch name from what ROCm tools report: ``"gfx942"`` or the number ``90402``.

    Feature suffixes (``gfx942:sramecc+:xnack-``) are dropped; None for anything else.
    """
    if isinstance(target, str):
        name = target.strip().lower().split(":", 1)[0]
        return name if gfx_version(name) is not None else None
    if isinstance(target, int) and not isinstance(target, bool) and target > 0:
        major, minor, step = target // 10000, target // 100 % 100, target % 100
        if minor > 15 or step > 15:
            return None
        return f"gfx{major}{minor:x}{step:x}"
    return None


def gfx_capability(arch: str | None) -> DeviceCapability | None:
    """The ``(major, minor)`` capability torch reports on ROCm for a gfx arch."""
    version = gfx_version(arch)
    return None if version is None else DeviceCapability(version[0], version[1])


def torch_version() -> tuple[int, int] | None:
    """``(major, minor)`` of the installed torch, from package metadata (no import)."""
    from importlib import metadata

    try:
        text = metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None
    match = re.match(r"^(\d+)\.(\d+)", text)
    return None if match is None else (int(match.group(1)), int(match.group(2)))


def query_quietly(what: str, query: Callable[[], T]) -> T | None:
    """Run a vendor-library query; None (logged at debug level) if it fails.

    Management libraries fail for reasons the caller cannot fix (no driver,
    a container without the device files); every device query has a fallback.
    """
    try:
        return query()
    except Exception as exc:  # the vendor libraries raise their own exception types
        logger.debug("%s failed: %s: %s", what, type(exc).__name__, exc)
        return None


class QueryCache:
    """Results of device queries on real hardware, by (what, device index).

    Only answers are kept: a query that found nothing is asked again next time.
    """

    def __init__(self) -> None:
        self._values: dict[tuple[str, int], Any] = {}

    def get(self, what: str, i: int, query: Callable[[], T | None]) -> T | None:
        """The cached answer for ``(what, i)``, running ``query`` the first time."""
        key = (what, i)
        if key not in self._values:
            value = query()
            if value is None:
                return None
            self._values[key] = value
        result: T = self._values[key]
        return result


def torch_cuda_query(what: str, query: Callable[[Any], T]) -> T | None:
    """Run ``query(torch.cuda)``; None without torch or without a visible GPU.

    Initialises CUDA (or HIP) in the calling process: only ever a fallback.
    """
    try:
        import torch
    except ImportError:
        return None

    def run() -> T | None:
        if not torch.cuda.is_available():
            return None
        return query(torch.cuda)

    return query_quietly(f"torch.cuda {what}", run)


class BuiltinPlatform(Platform):
    """What the built-in platforms share beyond :class:`Platform`.

    Profiles come from :mod:`hwplug.platforms.profiles`; a subclass says why
    its device cannot store a cache dtype (:meth:`_cache_dtype_obstacle`) or
    run bfloat16 models (:meth:`_bf16_obstacle`), and the messages, the
    supported lists and the suggestions are built here once.
    """

    def __init__(
        self,
        devices: Iterable[DeviceInfo] = (),
        *,
        simulated: bool = False,
        profile: str | None = None,
    ) -> None:
        super().__init__(devices, simulated=simulated, profile=profile)
        self._queried = QueryCache()

    @classmethod
    def profiles(cls) -> dict[str, DeviceInfo]:
        from hwplug.platforms.profiles import PROFILES

        return dict(PROFILES[cls.name])

    # -- device queries on real hardware ---------------------------------------------
    def _vendor_query(self, i: int, what: str, query: Callable[[Any, Any], T]) -> T | None:
        """Run ``query(library, handle)`` on device ``i`` with the vendor's management
        library (NVML, amdsmi); None where there is none or it fails."""
        return None

    def _live_query(
        self,
        what: str,
        i: int,
        *,
        vendor: Callable[[Any, Any], T | None],
        detected: Callable[[DeviceInfo], T | None],
        torch_cuda: Callable[[Any], T | None],
    ) -> T | None:
        """Ask the vendor library, then the detected :class:`DeviceInfo`, then
        ``torch.cuda`` (which initialises the device runtime) about device ``i``.

        Answers are cached per device; an empty answer counts as none.
        """

        def query() -> T | None:
            value = self._vendor_query(i, what, vendor)
            if not value and 0 <= i < len(self.devices):
                value = detected(self.devices[i])
            if not value:
                value = torch_cuda_query(what, torch_cuda)
            return value or None

        return self._queried.get(what, i, query)

    mla_without_chunked_prefill: ClassVar[bool] = False
    """Whether MLA models run here without chunked prefill (the CPU and XPU MLA kernels):
    unset chunked prefill is turned off and an unset ``max_num_batched_tokens``
    raised to hold a whole prompt."""
    mla_min_batched_tokens: ClassVar[int] = 2048
    """With ``mla_without_chunked_prefill``: the least ``max_num_batched_tokens`` filled in."""

    def default_chunked_prefill(self, config: EngineConfig) -> tuple[bool, str]:
        """Off for MLA models where the MLA kernels have no chunked prefill."""
        if config.model.use_mla and self.mla_without_chunked_prefill:
            return False, f"MLA attention on {self.name} has no chunked prefill"
        return super().default_chunked_prefill(config)

    def apply_mla_rules(self, config: EngineConfig, changes: ChangeLog) -> None:
        """Without chunked prefill for MLA: refuse it when explicit, and let a step hold a
        whole prompt (``max_num_batched_tokens`` >= ``max_model_len``) when unset."""
        if not (config.model.use_mla and self.mla_without_chunked_prefill):
            return
        if config.scheduler.enable_chunked_prefill:
            raise ConfigError(
                f"scheduler.enable_chunked_prefill=True is not supported for MLA models "
                f"(model.use_mla=True) on {self.describe_device()}: its MLA attention has no "
                "chunked prefill; set scheduler.enable_chunked_prefill=False"
            )
        fill_unset(
            changes,
            "scheduler.max_num_batched_tokens",
            max(config.model.max_model_len, self.mla_min_batched_tokens),
            f"MLA without chunked prefill on {self.name}: a step holds a whole prompt",
        )

    def _cache_dtype_obstacle(self, cache_dtype: str) -> str | None:
        """Why this device cannot store ``cache_dtype`` (None: nothing specific)."""
        return None

    def cache_dtype_problem(self, cache_dtype: str, config: EngineConfig | None) -> str | None:
        return cache_dtype_problem_for(self, cache_dtype, self._cache_dtype_obstacle)

    def _bf16_obstacle(self) -> str | None:
        """Why this device cannot run bfloat16 models (None: it can)."""
        return None

    def supported_model_dtypes(self) -> tuple[str, ...]:
        if self._bf16_obstacle() is None:
            return self.model_dtypes
        return tuple(d for d in self.model_dtypes if d != "bfloat16")

    def model_dtype_problem(self, dtype: str, config: EngineConfig | None) -> str | None:
        if canonical_dtype(dtype) == "bfloat16":
            why = self._bf16_obstacle()
            if why is not None:
                return model_dtype_message(self, dtype, why, ["float16"])
        return super().model_dtype_problem(dtype, config)
