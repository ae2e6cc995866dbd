"""Deliberately broken copies of the ACME NPU platform, one contract breach each.

Module-level classes (importable by name, so R02 runs their ``detect()`` in a
fresh process). This module must not import torch.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import TYPE_CHECKING, ClassVar

from acme_npu.plugin import NpuPlatform

from hwplug.core.errors import ConfigError

if TYPE_CHECKING:
    from hwplug.core.config import EngineConfig
    from hwplug.core.resolve import ChangeLog


class HiddenChangeNpu(NpuPlatform):
    """Halves an explicit ``scheduler.max_num_seqs`` without recording it."""

    def check_and_update_config(self, config: EngineConfig, changes: ChangeLog) -> None:
        super().check_and_update_config(config, changes)
        if changes.was_set("scheduler.max_num_seqs") and config.scheduler.max_num_seqs > 1:
            config.scheduler.max_num_seqs //= 2


class RefusedBlockNpu(NpuPlatform):
    """Advertises block size 16 and then refuses it."""

    def supported_block_sizes(self, model_config: object = None) -> tuple[int, ...]:
        return (16, 32, 64)

    def check_and_update_config(self, config: EngineConfig, changes: ChangeLog) -> None:
        super().check_and_update_config(config, changes)
        if config.cache.block_size == 16:
            raise ConfigError("cache.block_size=16 is not supported on ACME NPUs; use 32 or 64")


class NotAWrapperNpu(NpuPlatform):
    """Returns something that is not a ``GraphWrapper`` from ``graph_wrapper_cls()``."""

    def graph_wrapper_cls(self) -> type | None:
        return dict


class TorchDetectNpu(NpuPlatform):
    """Imports torch while detecting."""

    @classmethod
    def detect(cls) -> list:  # type: ignore[type-arg]
        import torch

        del torch
        return []


HANG = threading.Event()
"""Set by the tests while :class:`HangingNpu`'s profiles() should hang."""
RELEASE = threading.Event()
"""Set by the tests once they are done with :class:`HangingNpu` (it then returns)."""


class HangingNpu(NpuPlatform):
    """Its profiles() never return while :data:`HANG` is set (until :data:`RELEASE` is)."""

    @classmethod
    def profiles(cls) -> dict:  # type: ignore[type-arg]
        if HANG.is_set():
            RELEASE.wait(120)
        return super().profiles()


class NoWriteNpu(NpuPlatform):
    """Prefers the ``nowrite`` attention backend, which never writes the KV cache."""

    attention_order: ClassVar[tuple[str, ...]] = ("nowrite",)


def no_write_backend() -> type:
    """A backend that attends correctly over this step's keys and values but leaves the
    caches as it found them (it writes into copies)."""
    from hwplug.attention import TorchAttentionBackend

    class NoWriteAttention(TorchAttentionBackend):
        name = "nowrite"

        def attend(self, call):  # type: ignore[no-untyped-def]
            copies = {"key_cache": call.key_cache.clone(), "value_cache": call.value_cache.clone()}
            return super().attend(dataclasses.replace(call, **copies))

    return NoWriteAttention


def sloppy_backends() -> list[type]:
    """Two backends that look right at a glance: ``offby`` is 0.1% off (within the
    16-bit tolerance, far outside float32's), ``nowindow`` claims sliding windows and
    ignores them."""
    from hwplug.attention import TorchAttentionBackend

    class OffByAttention(TorchAttentionBackend):
        name = "offby"

        def attend(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            return super().attend(*args, **kwargs) * 1.001

    class NoWindowAttention(TorchAttentionBackend):
        name = "nowindow"

        def attend(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            window, self.sliding_window = self.sliding_window, None
            try:
                return super().attend(*args, **kwargs)
            finally:
                self.sliding_window = window

    return [OffByAttention, NoWindowAttention]


def cpu_preferring(backend: str) -> type:
    """A CPU platform (float32 models included) whose attention order is ``backend``."""
    from hwplug.platforms.cpu import CpuPlatform

    return type(f"Prefers{backend.title()}Cpu", (CpuPlatform,), {"attention_order": (backend,)})


class OffListDefaultNpu(NpuPlatform):
    """Its default block size (48) is not one it advertises (32, 64)."""

    default_block = 48


class NoFp8NameNpu(NpuPlatform):
    """Advertises fp8 caches but names no fp8 format."""

    fp8_dtype_name = None  # type: ignore[assignment]
