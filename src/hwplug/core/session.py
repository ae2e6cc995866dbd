"""What a session is to the layers below it, and which session is active.

A session (:class:`hwplug.Session`) holds what hwplug's parts used to find
through process-wide state: the plugin manager, the platform selection, the
platform, the attention-backend table and the level-3 compile backend. The
concrete class lives above core (it loads plugins); core, attention,
compilation and the conformance kit see it only through
:class:`SessionProtocol`, and take one as an argument wherever they need it.

Where a caller passes none (the module-level functions of the package face,
``CompilationConfig.init_backend()``, a custom op built outside
``compilation_config_for_ops``, the attention op), the **active session** is
used: the innermost :func:`activated` block of this thread or asyncio task,
else the process's default session, which ``import hwplug`` names here with
:func:`set_default`. That one slot is the only process-wide state core keeps.

Importing this module is free: nothing here imports pydantic or torch.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from hwplug.core.config import EngineConfig
    from hwplug.core.platform import Platform
    from hwplug.core.resolve import Resolution

__all__ = [
    "SessionProtocol",
    "activated",
    "active_session",
    "platform_for_device",
    "set_default",
]


@runtime_checkable
class SessionProtocol(Protocol):
    """The parts of a session the layers below the package face ask for."""

    @property
    def platform(self) -> Platform:
        """The session's current platform (an override, else the selected one)."""
        ...

    @property
    def hooks(self) -> Any:
        """The plugin manager's hook relay (``pm.hook``)."""
        ...

    @property
    def plugins_version(self) -> object:
        """A value that changes whenever the session's plugins may have changed."""
        ...

    def platform_from_spec(self, spec: str) -> Platform:
        """A platform by name or profile (``"cuda"``, ``"h100:8"``)."""
        ...

    def platform_names(self) -> tuple[str, ...]:
        """The names of every platform the session's plugins provide."""
        ...

    def profiles_of(self, name: str) -> tuple[str, ...]:
        """The simulated profiles of platform ``name``."""
        ...

    def resolve(
        self, config: EngineConfig | None = None, *, platform: Platform | str | None = None
    ) -> Resolution:
        """Resolve ``config`` with every plugin of the session taking part."""
        ...

    def attention_backends(self) -> Mapping[str, type]:
        """Every attention backend class by name (built-ins and the plugins')."""
        ...

    def piecewise_backend(self, compilation: Any, engine_config: Any) -> Callable[..., Any]:
        """The level-3 ``torch.compile`` backend for the session's platform."""
        ...


_active: contextvars.ContextVar[SessionProtocol | None] = contextvars.ContextVar(
    "hwplug_active_session", default=None
)
_default: list[Callable[[], SessionProtocol]] = []


def set_default(source: Callable[[], SessionProtocol]) -> None:
    """Name how to get the process's default session (the package face does, once)."""
    _default[:] = [source]


def active_session(purpose: str | None = None) -> SessionProtocol | None:
    """The active session: the innermost :func:`activated` one, else the default.

    :returns: None when there is none and ``purpose`` is None.
    :raises RuntimeError: there is none and ``purpose`` says what needed one
        (the message says how to pass a session or platform instead).
    """
    session = _active.get()
    if session is not None:
        return session
    if _default:
        return _default[0]()
    if purpose is None:
        return None
    raise RuntimeError(
        f"{purpose} needs a session: pass one (or a platform) explicitly, or import hwplug, "
        "whose default session is then used"
    )


def platform_for_device(device_type: str) -> Platform | None:
    """The active session's platform when its devices are torch ``device_type`` devices,
    else None (also without a session): the platform that answers for tensors there.

    May detect the platform (once per session); never initialises a device runtime.
    """
    session = active_session()
    if session is None:
        return None
    platform = session.platform
    return platform if platform.device_type == device_type else None


@contextlib.contextmanager
def activated(session: SessionProtocol) -> Iterator[SessionProtocol]:
    """Make ``session`` the active one for this block (this thread or task only)."""
    if not isinstance(session, SessionProtocol):
        raise TypeError(f"activated() takes a session, got {type(session).__name__}")
    token = _active.set(session)
    try:
        yield session
    finally:
        _active.reset(token)
