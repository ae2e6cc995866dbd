"""A session: one plugin manager and everything derived from it.

:class:`Session` holds the plugin manager, the platform selection (made on
first use), the current platform (a :meth:`Session.use_platform` override,
else a fixed platform, else the selection) and the attention-backend table
(rebuilt when a plugin is registered or unregistered). Resolution,
attention lookup, the support matrix, the conformance kit, the piecewise
compile backend and custom ops take a session, so two sessions with
different plugins answer independently in one process::

    manager = HwplugPluginManager()
    manager.load_builtins()                 # hwplug's platforms, no entry points
    builtins_only = hwplug.Session(manager)
    builtins_only.resolve(platform="h100")

The package face's module-level functions (``hwplug.resolve``,
``hwplug.get_platform``, ...) use the default session
(:func:`hwplug.default_session`). Nothing here imports torch or pydantic
until a method needs it.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import threading
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Any

from hwplug.attention.registry import (
    BUILTIN_BACKENDS,
    BackendTable,
    collect_backends,
    lookup_backend,
)
from hwplug.core import resolve as pipeline
from hwplug.core import session as core_session
from hwplug.core.errors import ConfigError
from hwplug.core.platform import Platform
from hwplug.plugins.plugin_manager import HwplugPluginManager
from hwplug.plugins.selection import platform_entry

if TYPE_CHECKING:
    from hwplug.core.config import EngineConfig
    from hwplug.core.resolve import Resolution
    from hwplug.plugins.selection import Selection

__all__ = ["PlatformOverride", "Session"]


@functools.cache
def _default_config() -> EngineConfig:
    """The default config, built once: resolution never changes the config it is given
    (it works on a copy), so every ``resolve()`` without a config can start from it."""
    # lazy: pydantic; `import hwplug` and platform selection stay light
    from hwplug.core.config import EngineConfig

    return EngineConfig()


class Session:
    """One plugin manager, its platform selection and what derives from them.

    ``plugin_manager``: the session's manager (default: a new one that loads
    the built-in platforms and every allowed entry point). ``platform``: a
    fixed platform (a :class:`Platform`, a name or a profile) instead of the
    selection. Thread-safe: the selection is made once even when many
    threads ask at once.
    """

    def __init__(
        self,
        plugin_manager: HwplugPluginManager | None = None,
        *,
        platform: Platform | str | None = None,
    ) -> None:
        if plugin_manager is not None and not isinstance(plugin_manager, HwplugPluginManager):
            raise ConfigError(
                "Session(plugin_manager=...) takes a HwplugPluginManager, got "
                f"{type(plugin_manager).__name__}"
            )
        if platform is not None and not isinstance(platform, Platform | str):
            raise ConfigError(
                "Session(platform=...) takes a Platform, a platform name or a profile, got "
                f"{type(platform).__name__}"
            )
        self._manager = plugin_manager
        self._fixed = platform
        self._selection: tuple[int, tuple[tuple[str, type], ...], Selection] | None = None
        """(plugin generation, platform table, selection) of the last selection."""
        self._lock = threading.RLock()
        self._override: contextvars.ContextVar[tuple[Platform, ...]] = contextvars.ContextVar(
            f"hwplug_session_{id(self):x}_platform", default=()
        )
        self._backends: tuple[object, BackendTable] | None = None

    def __repr__(self) -> str:
        state = "selected" if self._selection is not None else "not selected yet"
        return f"Session({state}, plugins={len(self.plugin_manager.list_name_plugin())})"

    def _after_fork(self) -> None:
        # The lock may have been held by a thread that does not exist in the child.
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ plugins
    @property
    def plugin_manager(self) -> HwplugPluginManager:
        """The session's plugin manager (built, and entry points loaded, on first use)."""
        manager = self._manager
        if manager is not None:
            return manager
        with self._lock:
            if self._manager is None:
                manager = HwplugPluginManager()
                manager.load_entrypoints()
                self._manager = manager
            return self._manager

    @property
    def hooks(self) -> Any:
        """The plugin manager's hook relay (``pm.hook``)."""
        return self.plugin_manager.hook

    @property
    def plugins_version(self) -> object:
        """Changes whenever a plugin is registered or unregistered in this session."""
        manager = self.plugin_manager
        return (id(manager), manager.generation)

    def describe(self, source: str) -> str:
        """A plugin name or ``platform:<name>`` with its distribution, for messages."""
        return self.plugin_manager.describe(source)

    # ------------------------------------------------------------------ platforms
    @property
    def selection(self) -> Selection:
        """The platform selection of this session: made on first use, and made again
        when the platform table changes (a plugin providing platforms was registered or
        unregistered); plugins that provide no platform leave it as it is."""
        manager = self.plugin_manager
        made = self._selection
        if made is not None and made[0] == manager.generation:
            return made[2]
        with self._lock:
            generation = manager.generation  # read before deriving (see its docstring)
            table = tuple((n, e.cls) for n, e in manager.platform_entries().items())
            made = self._selection
            if made is None or made[1] != table:
                made = (generation, table, manager.select())
            else:
                made = (generation, table, made[2])
            self._selection = made
            return made[2]

    @property
    def platform(self) -> Platform:
        """The current platform: this context's override, else the fixed one, else the selection."""
        override = self._override.get()
        if override:
            return override[-1]
        fixed = self._fixed
        if fixed is None:
            return self.selection.platform
        if isinstance(fixed, str):
            with self._lock:
                if isinstance(self._fixed, str):
                    self._fixed = self.platform_from_spec(self._fixed)
                fixed = self._fixed
        assert isinstance(fixed, Platform)
        return fixed

    def get_platform(self) -> Platform:
        """The current platform (:attr:`platform`)."""
        return self.platform

    def platform_from_spec(self, spec: str) -> Platform:
        """A platform by name (detected, else its representative profile) or by profile."""
        return self.plugin_manager.platform_from_spec(spec)

    def platform_names(self) -> tuple[str, ...]:
        """Every platform the session's plugins provide, by name."""
        return tuple(sorted(self.plugin_manager.platform_entries()))

    def profiles_of(self, name: str) -> tuple[str, ...]:
        """The simulated profiles of platform ``name``.

        :raises ConfigError: unknown platform (the known ones are listed).
        """
        return tuple(platform_entry(self.plugin_manager, name).cls.profiles())

    def as_platform(self, platform: Platform | str | None, what: str = "platform") -> Platform:
        """``platform`` as a :class:`Platform`: None is the current one, a string a name
        or profile.

        :raises ConfigError: something else was given.
        """
        if platform is None:
            return self.platform
        if isinstance(platform, str):
            return self.platform_from_spec(platform)
        if isinstance(platform, Platform):
            return platform
        raise ConfigError(
            f"{what} takes a Platform, a platform name or a profile, got {type(platform).__name__}"
        )

    def use_platform(self, target: Platform | type[Platform] | str) -> PlatformOverride:
        """Make ``target`` this session's current platform for a block or a function."""
        return PlatformOverride(target, session=self)

    # ------------------------------------------------------------------ resolution
    def resolve(
        self, config: EngineConfig | None = None, *, platform: Platform | str | None = None
    ) -> Resolution:
        """Resolve ``config`` for ``platform`` (default: the current platform) with every
        plugin of this session taking part (see :func:`hwplug.resolve`).

        :raises ConfigError: the config cannot run on the platform.
        :raises PluginError: the platform or a plugin misbehaved.
        """
        plat = self.as_platform(platform, "resolve(platform=...)")
        return pipeline.resolve(
            _default_config() if config is None else config,
            plat,
            self.hooks,
            describe=self.describe,
            attention_backends=self.attention_backends(),
        )

    # ------------------------------------------------------------------ attention
    def attention_backends(self) -> BackendTable:
        """Every attention backend class by name: the built-ins plus the plugins'
        (cached until a plugin is registered or unregistered), with who provides each
        and which platforms each serves (:class:`~hwplug.attention.BackendTable`).

        :raises PluginError: a plugin returned something else than backend
            classes, or two backends claim one name (both are named).
        """
        version = self.plugins_version
        cached = self._backends
        if cached is not None and cached[0] == version:
            return cached[1]

        manager = self.plugin_manager
        provided: dict[str, set[str]] = {}
        for name, entry in manager.platform_entries().items():
            source = manager.distribution_of(entry.plugin) or f"plugin:{entry.plugin}"
            provided.setdefault(source, set()).add(name)

        def own_platforms(plugin: str, distribution: str) -> set[str]:
            return provided.get(distribution or f"plugin:{plugin}", set())

        table = collect_backends(
            BUILTIN_BACKENDS, manager.attention_backend_results(), own_platforms
        )
        self._backends = (version, table)
        return table

    def get_backend(self, name: str) -> type:
        """The attention backend class called ``name``.

        :raises ConfigError: unknown name (the message lists the known ones).
        """
        return lookup_backend(name, self.attention_backends())

    # ------------------------------------------------------------------ compilation
    def piecewise_backend(self, compilation: Any, engine_config: Any) -> Callable[..., Any]:
        """The level-3 ``torch.compile`` backend, capturing with this session's platform."""
        # lazy: torch; `import hwplug` and platform selection stay light
        from hwplug.compilation.piecewise import PiecewiseBackend

        return PiecewiseBackend(compilation, engine_config, platform=self.platform)

    # ------------------------------------------------------------------ activation
    @contextlib.contextmanager
    def activate(self) -> Iterator[Session]:
        """Make this the active session of the block (this thread or task only): the
        attention op, custom ops and ``CompilationConfig.init_backend()`` use it."""
        with core_session.activated(self):
            yield self


class PlatformOverride(contextlib.ContextDecorator):
    """Make a platform current in a session for a block or a function, then restore.

    ``target`` is a :class:`~hwplug.core.platform.Platform` instance or class, a
    platform name (``"cuda"``: the real one when present, else its
    representative profile) or a profile (``"h100"``, ``"h100:8"``). The
    override holds in the current thread or asyncio task only. ``session``:
    the session whose platform is overridden, or a function returning it
    (asked when the block is entered). As a context manager it yields the
    platform::

        with hwplug.use_platform("mi300x") as platform:
            assert hwplug.current_platform is platform
    """

    def __init__(
        self,
        target: Platform | type[Platform] | str,
        *,
        session: Session | Callable[[], Session],
    ) -> None:
        if not isinstance(target, Platform | str) and not (
            isinstance(target, type) and issubclass(target, Platform)
        ):
            raise ConfigError(
                "use_platform() takes a Platform, a Platform subclass, a platform name or a "
                f"profile, got {type(target).__name__}"
            )
        self.target = target
        self._session = session
        # Entries per thread: a decorated function may run in several threads at once.
        self._local = threading.local()

    def _which(self) -> Session:
        session = self._session
        return session if isinstance(session, Session) else session()

    def _platform(self, session: Session) -> Platform:
        target = self.target
        if isinstance(target, Platform):
            return target
        if isinstance(target, str):
            return session.platform_from_spec(target)
        devices = target.detect()
        if devices:
            return target(devices)
        profile = target.representative()
        if profile is None:
            return target(())
        return target.simulate(profile)

    def _entries(self) -> list[tuple[Session, contextvars.Token[tuple[Platform, ...]]]]:
        entries: list[tuple[Session, contextvars.Token[tuple[Platform, ...]]]] | None = getattr(
            self._local, "entries", None
        )
        if entries is None:
            entries = self._local.entries = []
        return entries

    def __enter__(self) -> Platform:
        session = self._which()
        platform = self._platform(session)
        var = session._override
        self._entries().append((session, var.set((*var.get(), platform))))
        return platform

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        session, token = self._entries().pop()
        var = session._override
        try:
            var.reset(token)
        except ValueError:
            # Exited in another context than the one it was entered in (a
            # generator resumed elsewhere): drop the innermost override there.
            var.set(var.get()[:-1])
