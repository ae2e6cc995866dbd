"""Which attention backends exist: the built-ins plus what plugins contribute.

:func:`collect_backends` and :func:`lookup_backend` are pure: they take the
built-ins and the plugins' hook results and return a name -> class table, or
raise an error naming whoever is at fault. :func:`available_backends` and
:func:`get_backend` ask a session for its table (default: the active one).
Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

from hwplug.attention.base import ANY_PLATFORM, AttentionBackend, describe_platforms
from hwplug.attention.torch_backend import TorchAttentionBackend
from hwplug.attention.triton_backend import TritonAttentionBackend
from hwplug.core.errors import ConfigError, PluginError, brief
from hwplug.core.graphs import AttentionGraphSupport
from hwplug.core.names import is_name
from hwplug.core.session import SessionProtocol, active_session

if TYPE_CHECKING:
    from hwplug.core.config import EngineConfig
    from hwplug.core.platform import Platform

__all__ = [
    "BUILTIN_BACKENDS",
    "BackendTable",
    "backends_for",
    "available_backends",
    "collect_backends",
    "get_backend",
    "lookup_backend",
]

BUILTIN_BACKENDS: Mapping[str, type[AttentionBackend]] = MappingProxyType(
    {cls.name: cls for cls in (TorchAttentionBackend, TritonAttentionBackend)}
)
"""The backends that ship with hwplug, by name (read-only)."""


def _owner(plugin: str, distribution: str) -> str:
    return f"plugin {plugin!r}" + (f" (distribution {distribution!r})" if distribution else "")


def _check_backend(item: object, owner: str) -> type[AttentionBackend]:
    if not isinstance(item, type) or not issubclass(item, AttentionBackend):
        raise PluginError(
            f"{owner} returned {brief(item)} from hwplug_attention_backends(); every entry "
            "must be a subclass of hwplug.attention.AttentionBackend"
        )
    scope = item.platforms
    if scope is not None and (
        isinstance(scope, str)
        or not isinstance(scope, (tuple, list, frozenset, set))
        or not all(isinstance(p, str) and (p == ANY_PLATFORM or is_name(p)) for p in scope)
    ):
        raise PluginError(
            f"{owner} returned attention backend {item.__qualname__} whose platforms is "
            f"{brief(scope)}; use None, a tuple of platform names such as ('npu',), or "
            f"({ANY_PLATFORM!r},) for every platform"
        )
    name = item.__dict__.get("name", item.name)
    if not is_name(name):
        raise PluginError(
            f"{owner} returned attention backend {item.__qualname__} with name {brief(name)}; "
            "a name is a non-empty lower-case string of letters, digits, '_', '.' or '-' "
            "starting with a letter"
        )
    if not isinstance(item.graph_support, AttentionGraphSupport):
        raise PluginError(
            f"{owner} returned attention backend {name!r} whose graph_support is "
            f"{brief(item.graph_support)}; use an hwplug.core.graphs.AttentionGraphSupport member"
        )
    return item


class BackendTable(Mapping[str, type[AttentionBackend]]):
    """The attention backends of a session, by name (read-only), with who provides each
    and which platforms each serves.

    A backend serves a platform when its effective scope (:meth:`scope`) names the
    platform and its own :meth:`~AttentionBackend.problem` finds nothing. The scope is
    the class's :attr:`~AttentionBackend.platforms`; where that is None, a plugin's
    backend serves the platforms its own distribution provides (so one vendor's kernels
    are never handed another vendor's tensors), and a built-in, or a backend whose
    distribution provides no platform, serves every platform.
    """

    def __init__(
        self,
        classes: Mapping[str, type[AttentionBackend]],
        owners: Mapping[str, str],
        scopes: Mapping[str, tuple[str, ...] | None],
    ) -> None:
        self._classes = dict(classes)
        self._owners = dict(owners)
        self._scopes = dict(scopes)

    def __getitem__(self, name: str) -> type[AttentionBackend]:
        return self._classes[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._classes)

    def __len__(self) -> int:
        return len(self._classes)

    def __repr__(self) -> str:
        return f"BackendTable({', '.join(sorted(self._classes))})"

    def owner(self, name: str) -> str:
        """Who provides backend ``name``: ``"plugin 'acme' (distribution 'acme-npu')"``."""
        return self._owners.get(name, "an unknown provider")

    def scope(self, name: str) -> tuple[str, ...] | None:
        """The platform names backend ``name`` serves; None: every platform."""
        return self._scopes.get(name)

    def serves(self, name: str, platform: Platform) -> bool:
        """Whether backend ``name``'s scope includes ``platform`` (its other rules aside)."""
        scope = self.scope(name)
        return scope is None or ANY_PLATFORM in scope or platform.name in scope

    def problem(self, name: str, config: EngineConfig, platform: Platform) -> str | None:
        """Why backend ``name`` cannot serve ``config`` on ``platform``: first its
        scope (naming who provides it and which platforms it serves), then the class's
        own :meth:`~AttentionBackend.problem`; None when it can."""
        cls = self._classes[name]
        if not self.serves(name, platform):
            scope = self.scope(name) or ()
            inferred = cls.platforms is None
            return (
                f"the {name} attention backend of {self.owner(name)} serves "
                f"{describe_platforms(scope)}"
                + (" (the platforms its distribution provides)" if inferred else "")
                + f"; {platform.describe_device()} is platform {platform.name!r}"
            )
        return cls.problem(config, platform)

    def for_platform(self, platform: Platform) -> dict[str, type[AttentionBackend]]:
        """The backends whose scope includes ``platform``, by name."""
        return {n: c for n, c in self._classes.items() if self.serves(n, platform)}


def collect_backends(
    builtins: Mapping[str, type[AttentionBackend]],
    plugin_results: Iterable[tuple[str, str, object]],
    own_platforms: Callable[[str, str], Collection[str]] | None = None,
) -> BackendTable:
    """The built-ins plus every class the plugins returned, by name.

    ``plugin_results`` holds ``(plugin name, distribution, returned value)``
    for each ``hwplug_attention_backends()`` implementation (distribution ""
    when unknown). A plugin returning one class several times is harmless.
    ``own_platforms(plugin, distribution)`` names the platforms the plugin's
    distribution provides (the plugin's own where the distribution is unknown):
    a plugin's backend whose ``platforms`` is None serves those, or every
    platform when there are none (default: none known).

    :raises PluginError: a result is not a list of ``AttentionBackend``
        subclasses with valid names (naming the plugin), or two different
        classes claim one name (naming both owners).
    """
    table: dict[str, type[AttentionBackend]] = dict(builtins)
    owners = {name: "hwplug's built-in backends" for name in builtins}
    scopes: dict[str, tuple[str, ...] | None] = {
        name: _declared(cls) for name, cls in builtins.items()
    }
    for plugin, distribution, result in plugin_results:
        owner = _owner(plugin, distribution)
        if not isinstance(result, (list, tuple)):
            raise PluginError(
                f"{owner} returned {brief(result)} from hwplug_attention_backends(); it must "
                "return a list of AttentionBackend subclasses"
            )
        for item in result:
            cls = _check_backend(item, owner)
            name = cls.name
            existing = table.get(name)
            if existing is not None and existing is not cls:
                raise PluginError(
                    f"attention backend name {name!r} is claimed twice: by {owners[name]} "
                    f"({existing.__module__}.{existing.__qualname__}) and by {owner} "
                    f"({cls.__module__}.{cls.__qualname__}); backend names must be unique"
                )
            table[name] = cls
            owners.setdefault(name, owner)
            if name not in scopes:
                scope = _declared(cls)
                if cls.platforms is None and own_platforms is not None:
                    provided = tuple(sorted(own_platforms(plugin, distribution)))
                    scope = provided or None
                scopes[name] = scope
    return BackendTable(table, owners, scopes)


def _declared(cls: type[AttentionBackend]) -> tuple[str, ...] | None:
    scope = cls.platforms
    if scope is None or ANY_PLATFORM in scope:
        return None
    return tuple(scope)


def lookup_backend(
    name: object, backends: Mapping[str, type[AttentionBackend]]
) -> type[AttentionBackend]:
    """The backend class called ``name``.

    :raises ConfigError: no backend has that name (the message lists the known ones).
    """
    if isinstance(name, str) and name in backends:
        return backends[name]
    known = ", ".join(sorted(backends)) or "none"
    hint = ""
    if isinstance(name, str) and name.strip().lower() in backends:
        hint = f" (names are lower case: {name.strip().lower()!r})"
    raise ConfigError(f"unknown attention backend {brief(name)}{hint}; known backends: {known}")


def available_backends(
    session: SessionProtocol | None = None,
) -> dict[str, type[AttentionBackend]]:
    """Every attention backend by name: the built-ins plus every class the plugins'
    ``hwplug_attention_backends()`` hooks return, in ``session`` (default: the
    active session; the built-ins alone where there is none).

    :raises PluginError: a plugin returned something else than backend classes,
        or two backends claim one name (both are named).
    """
    chosen = session if session is not None else active_session()
    if chosen is None:
        return dict(BUILTIN_BACKENDS)
    return dict(chosen.attention_backends())


def backends_for(
    platform: Platform, session: SessionProtocol | None = None
) -> dict[str, type[AttentionBackend]]:
    """The attention backends that may serve ``platform`` (their scope includes it), by
    name, in ``session`` (default: the active one; the built-ins alone where there is
    none). What suggestions, the support matrix and the conformance kit list."""
    chosen = session if session is not None else active_session()
    if chosen is None:
        return collect_backends(BUILTIN_BACKENDS, ()).for_platform(platform)
    table = chosen.attention_backends()
    if not isinstance(table, BackendTable):  # another session type: declared scopes only
        table = BackendTable(table, {}, {n: _declared(c) for n, c in table.items()})
    return table.for_platform(platform)


def get_backend(name: str, session: SessionProtocol | None = None) -> type[AttentionBackend]:
    """The attention backend class called ``name`` in ``session`` (default: the active one).

    :raises ConfigError: unknown name (the message lists the known ones).
    """
    chosen = session if session is not None else active_session()
    return lookup_backend(name, BUILTIN_BACKENDS if chosen is None else chosen.attention_backends())
