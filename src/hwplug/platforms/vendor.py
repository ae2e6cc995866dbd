"""The public base of hardware platforms, built-in or a vendor's own.

:class:`VendorPlatform` adds to :class:`~hwplug.core.platform.Platform` what
the built-in platforms share and any vendor's platform may use: profiles from a
table, live device queries on real hardware described as a table
(:class:`DeviceQuery`: ask the vendor management library, then what detection
found, then ``torch.cuda``), the MLA rules of platforms without chunked MLA
prefill, and error messages for cache and model dtypes that always name the
exact value that would work. :class:`VendorRuntime` is its device runtime:
the base one, with memory usage asked from the device-query table first.

Nothing here imports torch at import time.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from hwplug.core.dtypes import CACHE_DTYPE_FORMATS, canonical_dtype, is_fp8_cache
from hwplug.core.errors import ConfigError
from hwplug.core.platform import DeviceCapability, DeviceInfo, Platform
from hwplug.core.runtime import DeviceRuntime
from hwplug.platforms.sysfs import Library, query_library

if TYPE_CHECKING:
    from hwplug.core.config import EngineConfig
    from hwplug.core.resolve import ChangeLog

__all__ = [
    "DeviceQuery",
    "VendorPlatform",
    "VendorRuntime",
    "cache_dtype_message",
    "cache_dtype_problem_for",
    "fill_unset",
    "is_fp8_cache",
    "model_dtype_message",
    "quote_choices",
    "torch_cuda_query",
]

logger = logging.getLogger("hwplug.platforms")

T = TypeVar("T")


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
    rejected (a vendor's own format, such as ``fp8_inc``, is named by its
    note). The message suggests the
    values that work on this device.
    """
    why = obstacle(cache_dtype)
    if why is None and cache_dtype not in platform.cache_dtypes:
        fmt = CACHE_DTYPE_FORMATS.get(cache_dtype)
        if fmt is not None and fmt.listed_only and fmt.note:
            why = f"{cache_dtype} is {fmt.note}"
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


def torch_cuda_query(what: str, query: Callable[[Any], T]) -> T | None:
    """Run ``query(torch.cuda)``; None without torch, without a visible GPU, or on error.

    Initialises CUDA (or HIP) in the calling process: only ever a fallback.
    """
    try:
        import torch
    except ImportError:
        return None
    try:
        if not torch.cuda.is_available():
            return None
        return query(torch.cuda)
    except Exception as exc:
        logger.debug("torch.cuda %s failed: %s: %s", what, type(exc).__name__, exc)
        return None


@dataclasses.dataclass(frozen=True)
class DeviceQuery:
    """How a :class:`VendorPlatform` answers one question about a real device.

    Sources are tried in order: ``vendor(library, handle)`` through the
    platform's management library (no device runtime), ``detected(device)``
    from what detection found, then ``torch_cuda(torch.cuda, index)``, which
    initialises the device runtime. An empty answer counts as none.
    ``cached`` answers are kept per device (memory usage is not).
    """

    vendor: Callable[[Any, Any], Any] | None = None
    detected: Callable[[DeviceInfo], Any] | None = None
    torch_cuda: Callable[[Any, int], Any] | None = None
    cached: bool = True


class VendorRuntime(DeviceRuntime):
    """The device runtime of a :class:`VendorPlatform`: the base services, with the
    memory in use asked from the platform's device-query table (``memory usage``:
    the vendor library, then ``torch.cuda``) where it has that question."""

    platform: VendorPlatform

    def __init__(self, platform: VendorPlatform) -> None:
        super().__init__(platform)

    def get_current_memory_usage(self, i: int = 0) -> int:
        """Bytes in use on device ``i`` (the device-query table; never cached).

        Simulated devices are idle (0).
        """
        plat = self.platform
        if plat.simulated or "memory usage" not in plat.device_queries:
            return super().get_current_memory_usage(i)
        used = plat.query_device("memory usage", i)
        return int(used) if used is not None else 0


class VendorPlatform(Platform):
    """What the built-in platforms share beyond :class:`Platform`, for any vendor.

    A subclass sets :attr:`profile_table` (its simulated devices), and for
    real devices :attr:`library` and :attr:`device_queries`; it says why its
    device cannot store a cache dtype (:meth:`device_cache_dtype_problem`)
    or run bfloat16 models (:meth:`bf16_problem`), and the messages, the
    supported lists and the suggestions are built here once. Its runtime is a
    :class:`VendorRuntime` unless it names another in ``runtime_cls``.
    """

    runtime_cls: ClassVar[type[DeviceRuntime]] = VendorRuntime

    profile_table: ClassVar[Mapping[str, DeviceInfo]] = {}
    """Simulated profiles of this platform, by name."""
    library: ClassVar[Library | None] = None
    """The vendor management library device queries ask first (NVML, amdsmi)."""
    device_queries: ClassVar[Mapping[str, DeviceQuery]] = {}
    """How to answer ``capability``, ``name``, ``memory``, ``memory usage`` (and
    platform-specific questions) on real hardware."""

    @classmethod
    def profiles(cls) -> dict[str, DeviceInfo]:
        return dict(cls.profile_table)

    # -- device queries on real hardware ---------------------------------------------
    def library_target(self, i: int) -> Any:
        """What the library knows logical device ``i`` by: its physical index.

        :raises IndexError: the visibility variable does not list device ``i``.
        """
        return self.device_id_to_physical_device_id(i)

    def library_handle(self, library: Any, target: Any) -> Any:
        """The library's handle of the device ``target`` names (NVML and amdsmi differ):
        a platform that sets :attr:`library` implements it."""
        raise NotImplementedError(
            f"platform {self.name!r} sets library={self.library!r} but does not implement "
            "library_handle()"
        )

    def query_device(self, what: str, i: int = 0) -> Any:
        """Answer ``what`` about real device ``i`` from :attr:`device_queries`; None
        when nothing knows (or the platform is simulated, or has no such query)."""
        query = self.device_queries.get(what)
        if self.simulated or query is None:
            return None
        # answers are kept per instance, made on first use
        answers: dict[tuple[str, int], Any] = self.__dict__.setdefault("_answers", {})
        key = (what, i)
        if query.cached and key in answers:
            return answers[key]
        value = None
        if query.vendor is not None and self.library is not None:
            ask = query.vendor
            target = self.library_target(i)
            value = query_library(
                self.library,
                f"{what} of device {target}",
                lambda lib: ask(lib, self.library_handle(lib, target)),
                quiet=True,
            )
        if not value and query.detected is not None and 0 <= i < len(self.devices):
            value = query.detected(self.devices[i])
        if not value and query.torch_cuda is not None:
            ask_torch = query.torch_cuda
            value = torch_cuda_query(what, lambda tc: ask_torch(tc, i))
        value = value or None
        if value is not None and query.cached:
            answers[key] = value
        return value

    def get_device_capability(self, i: int = 0) -> DeviceCapability | None:
        """Compute capability of device ``i``.

        Simulated: the profile's. Real: the device-query table (vendor library,
        detection, then ``torch.cuda``, which initialises the runtime); None
        when nothing knows.
        """
        if self.simulated or "capability" not in self.device_queries:
            return super().get_device_capability(i)
        value: DeviceCapability | None = self.query_device("capability", i)
        return value

    def get_device_name(self, i: int = 0) -> str:
        """Marketing name of device ``i`` (the device-query table on real hardware)."""
        name = self.query_device("name", i)
        return str(name) if name is not None else super().get_device_name(i)

    def get_device_total_memory(self, i: int = 0) -> int:
        """Total memory of device ``i`` in bytes (the device-query table on real hardware)."""
        if self.simulated or "memory" not in self.device_queries:
            return super().get_device_total_memory(i)
        total = self.query_device("memory", i)
        return int(total) if total is not None else 0

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

    def device_cache_dtype_problem(self, cache_dtype: str) -> str | None:
        """Why this device cannot store ``cache_dtype`` (None: nothing specific)."""
        return None

    def cache_dtype_problem(self, cache_dtype: str, config: EngineConfig | None) -> str | None:
        return cache_dtype_problem_for(self, cache_dtype, self.device_cache_dtype_problem)

    def bf16_problem(self) -> str | None:
        """Why this device cannot run bfloat16 models (None: it can)."""
        return None

    def supported_model_dtypes(self) -> tuple[str, ...]:
        if self.bf16_problem() is None:
            return self.model_dtypes
        return tuple(d for d in self.model_dtypes if d != "bfloat16")

    def model_dtype_problem(self, dtype: str, config: EngineConfig | None) -> str | None:
        if canonical_dtype(dtype) == "bfloat16":
            why = self.bf16_problem()
            if why is not None:
                return model_dtype_message(self, dtype, why, ["float16"])
        return super().model_dtype_problem(dtype, config)
