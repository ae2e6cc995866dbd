"""Custom ops: layers with a reference implementation and per-platform fast paths.

A custom op is a ``torch.nn.Module`` subclass of :class:`CustomOp` that
implements ``forward_native`` (plain PyTorch, what the compiler sees and
fuses) and, where it pays, ``forward_cuda``, ``forward_hip``,
``forward_cpu``, ``forward_hpu``, ``forward_xpu`` or ``forward_oot`` (any
out-of-tree platform). Each instance picks its forward once, at
construction, from the platform and the compilation config in force
(:func:`compilation_config_for_ops`; the platform defaults to the one the
package face provides, ``hwplug.current_platform``):

* a disabled op always runs ``forward_native``;
* an enabled op runs the platform's method, named by
  ``Platform.custom_op_forward`` (``forward_cuda`` on CUDA, ``forward_hip``
  on ROCm, ``forward_cpu``, ``forward_hpu``, ``forward_xpu``, and
  ``forward_oot`` on any other platform). Every method defaults to
  ``forward_native`` (``forward_hip`` goes through ``forward_cuda``, since
  HIP builds of CUDA kernels are the norm).

Enabling follows ``compilation.custom_ops``: ``"all"``/``"none"`` set the
default, ``"+name"``/``"-name"`` switch one op; without ``"all"``/``"none"``
ops are enabled unless Inductor compiles the model (level PIECEWISE with
``use_inductor``), because Inductor generates better fused kernels from
``forward_native``. Each construction is counted in the config's
``enabled_custom_ops``/``disabled_custom_ops`` for ``custom_op_log_check()``.

Vendors replace an op without monkey-patching: ``@CustomOp.register_oot("name",
platform="npu")`` registers a class that is instantiated instead of the
in-tree op (on that platform only, or everywhere without ``platform``).

This module does not import torch until :class:`CustomOp` itself is first
used; the registries and the enabling rules are torch-free.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from hwplug.core import session
from hwplug.core.errors import ConfigError

if TYPE_CHECKING:
    import torch

    from hwplug.core.config import CompilationConfig
    from hwplug.core.platform import Platform

__all__ = [
    "CustomOp",
    "compilation_config_for_ops",
    "custom_op_enabled",
    "forward_method_name",
    "get_op_compilation_config",
    "op_registry",
    "op_registry_oot",
]

_T = TypeVar("_T", bound=type)

op_registry: dict[str, type] = {}
"""In-tree custom ops by name (filled by ``CustomOp.register``)."""

op_registry_oot: dict[tuple[str, str | None], type] = {}
"""Out-of-tree replacements by ``(op name, platform name or None for every platform)``."""

_PIECEWISE_LEVEL = 3
_op_config: ContextVar[CompilationConfig | None] = ContextVar("hwplug_op_config", default=None)
_op_platform: ContextVar[Platform | None] = ContextVar("hwplug_op_platform", default=None)
_default_config: list[CompilationConfig] = []
_build_lock = threading.Lock()


def _current_platform() -> Platform:
    platform = _op_platform.get()
    if platform is not None:
        return platform
    active = session.active_session("building a custom op")
    assert active is not None  # active_session raises when there is none and a purpose is given
    return active.platform


@contextlib.contextmanager
def compilation_config_for_ops(
    config: Any, platform: Platform | None = None
) -> Iterator[CompilationConfig]:
    """Build custom ops inside this block against ``config`` (and ``platform``).

    ``config`` is a ``CompilationConfig`` or an ``EngineConfig`` (its
    ``compilation`` part is used); ``platform`` decides which forward enabled
    ops run (default: the current platform). Ops record themselves into this
    config's ``enabled_custom_ops``/``disabled_custom_ops``.
    """
    compilation = getattr(config, "compilation", config)
    if not hasattr(compilation, "custom_ops"):
        raise ValueError(
            "compilation_config_for_ops needs a CompilationConfig or an EngineConfig, "
            f"got {type(config).__name__}"
        )
    token = _op_config.set(compilation)
    platform_token = _op_platform.set(platform) if platform is not None else None
    try:
        yield compilation
    finally:
        if platform_token is not None:
            _op_platform.reset(platform_token)
        _op_config.reset(token)


def get_op_compilation_config() -> CompilationConfig:
    """The config of :func:`compilation_config_for_ops`, else a process-wide default one."""
    config = _op_config.get()
    if config is not None:
        return config
    if not _default_config:
        # lazy: pydantic; `import hwplug` stays light
        from hwplug.core.config import CompilationConfig

        _default_config.append(CompilationConfig())
    return _default_config[0]


def custom_op_enabled(name: str, config: CompilationConfig) -> bool:
    """Whether the op ``name`` is enabled under ``config.custom_ops``.

    ``+name`` enables and ``-name`` disables it; otherwise ``"all"``/``"none"``
    decide; otherwise it is enabled iff the level is below PIECEWISE or
    ``use_inductor`` is off.

    :raises ConfigError: ``custom_ops`` both enables and disables ``name``.
    """
    ops = config.custom_ops
    enable = f"+{name}" in ops
    disable = f"-{name}" in ops
    if enable and disable:
        raise ConfigError(
            f"compilation.custom_ops both enables and disables {name!r} ('+{name}' and "
            f"'-{name}'); keep one of them"
        )
    if enable or disable:
        return enable
    if "all" in ops:
        return True
    if "none" in ops:
        return False
    level = config.level or 0
    return level < _PIECEWISE_LEVEL or not config.use_inductor


def forward_method_name(platform: Platform | str) -> str:
    """The forward method an enabled op uses on ``platform``.

    A platform answers with its ``custom_op_forward``; a bare name, with no
    platform to ask, gets ``forward_oot``.
    """
    if isinstance(platform, str):
        return "forward_oot"
    return str(platform.custom_op_forward)


def _check_op_name(name: object, what: str) -> str:
    if not isinstance(name, str) or not name or name[0] in "+-" or name in ("all", "none"):
        raise ValueError(
            f"{what} needs an op name (a non-empty string not starting with '+'/'-' and not "
            f"'all'/'none'), got {name!r}"
        )
    return name


class _CustomOpBase:
    """The torch-free part of :class:`CustomOp` (registries, enabling, dispatch)."""

    name: ClassVar[str]
    """The registered op name (set by :meth:`register`)."""
    op_registry: ClassVar[dict[str, type]] = op_registry
    op_registry_oot: ClassVar[dict[tuple[str, str | None], type]] = op_registry_oot

    # -- implementations ------------------------------------------------------
    def forward_native(self, *args: Any, **kwargs: Any) -> Any:
        """The reference implementation in plain PyTorch (required)."""
        raise NotImplementedError(f"{type(self).__name__} must implement forward_native")

    def forward_cuda(self, *args: Any, **kwargs: Any) -> Any:
        """NVIDIA GPUs; defaults to ``forward_native``."""
        return self.forward_native(*args, **kwargs)

    def forward_hip(self, *args: Any, **kwargs: Any) -> Any:
        """AMD GPUs (ROCm); defaults to ``forward_cuda``."""
        return self.forward_cuda(*args, **kwargs)

    def forward_cpu(self, *args: Any, **kwargs: Any) -> Any:
        """CPUs; defaults to ``forward_native``."""
        return self.forward_native(*args, **kwargs)

    def forward_hpu(self, *args: Any, **kwargs: Any) -> Any:
        """Intel Gaudi; defaults to ``forward_native``."""
        return self.forward_native(*args, **kwargs)

    def forward_xpu(self, *args: Any, **kwargs: Any) -> Any:
        """Intel GPUs; defaults to ``forward_native``."""
        return self.forward_native(*args, **kwargs)

    def forward_oot(self, *args: Any, **kwargs: Any) -> Any:
        """Any out-of-tree (vendor) platform; defaults to ``forward_native``."""
        return self.forward_native(*args, **kwargs)

    # -- enabling and dispatch ----------------------------------------------------
    @classmethod
    def op_name(cls) -> str:
        """The registered name, or the class name for an unregistered op."""
        return cls.__dict__.get("name") or getattr(cls, "name", None) or cls.__name__

    @classmethod
    def enabled(cls, config: CompilationConfig | None = None) -> bool:
        """Whether this op is enabled under ``config`` (default: the current one)."""
        return custom_op_enabled(
            cls.op_name(), config if config is not None else get_op_compilation_config()
        )

    def dispatch_forward(self) -> Callable[..., Any]:
        """Choose this instance's forward and record the choice in the config."""
        config = get_op_compilation_config()
        name = self.op_name()
        enabled = self.enabled(config)
        counter = config.enabled_custom_ops if enabled else config.disabled_custom_ops
        counter.update([name])
        if not enabled:
            return self.forward_native
        method: Callable[..., Any] = getattr(self, forward_method_name(_current_platform()))
        return method

    # -- registries -----------------------------------------------------------------
    @classmethod
    def register(cls, name: str) -> Callable[[_T], _T]:
        """Class decorator: register an in-tree op under ``name``."""
        _check_op_name(name, "CustomOp.register")

        def decorator(op_cls: _T) -> _T:
            existing = op_registry.get(name)
            if existing is not None and _qualname(existing) != _qualname(op_cls):
                raise ValueError(
                    f"custom op name {name!r} is already registered by {_qualname(existing)}; "
                    f"choose another name for {_qualname(op_cls)}"
                )
            op_cls.name = name  # type: ignore[attr-defined]
            op_registry[name] = op_cls
            return op_cls

        return decorator

    @classmethod
    def register_oot(
        cls, name: str | None = None, *, platform: str | None = None
    ) -> Callable[[_T], _T]:
        """Class decorator: replace the in-tree op ``name`` with the decorated class.

        Without ``name`` the decorated class's own name is used. With
        ``platform`` the replacement applies only while that platform is
        current; a platform-specific replacement beats a general one.
        """
        if name is not None:
            _check_op_name(name, "CustomOp.register_oot")

        def decorator(op_cls: _T) -> _T:
            op = name if name is not None else op_cls.__name__
            op_registry_oot[(op, platform)] = op_cls
            return op_cls

        return decorator

    @classmethod
    def _replacement(cls) -> type | None:
        name = cls.__dict__.get("name")
        if name is None or op_registry.get(name) is not cls:
            return None
        if not op_registry_oot:
            return None
        platform = _current_platform().name
        return op_registry_oot.get((name, platform)) or op_registry_oot.get((name, None))


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _build_custom_op() -> type:
    import torch

    class CustomOp(_CustomOpBase, torch.nn.Module):
        """Base class of custom ops (see the module docstring)."""

        def __new__(cls, *args: Any, **kwargs: Any) -> Any:
            replacement = cls._replacement()
            if replacement is None or replacement is cls:
                return super().__new__(cls)
            if issubclass(replacement, cls):
                # Python then runs replacement.__init__ with the same arguments.
                return super().__new__(replacement)
            # Not an instance of cls, so Python will not initialise it again.
            return replacement(*args, **kwargs)

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._forward_method = self.dispatch_forward()

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            return self._forward_method(*args, **kwargs)

    CustomOp.__module__ = __name__
    return CustomOp


if TYPE_CHECKING:

    class CustomOp(_CustomOpBase, torch.nn.Module):
        """Base class of custom ops (see the module docstring)."""

        def forward(self, *args: Any, **kwargs: Any) -> Any: ...

else:

    def __getattr__(name: str) -> Any:
        # PEP 562: build the nn.Module subclass (and import torch) on first use only.
        if name == "CustomOp":
            with _build_lock:
                cls = globals().get("CustomOp")
                if cls is None:
                    cls = globals()["CustomOp"] = _build_custom_op()
            return cls
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
