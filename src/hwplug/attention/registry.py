"""Which attention backends exist: the built-ins plus what plugins contribute.

:func:`collect_backends` and :func:`lookup_backend` are pure: they take the
built-ins and the plugins' hook results and return a name -> class table, or
raise an error naming whoever is at fault. :func:`available_backends` and
:func:`get_backend` ask a session for its table (default: the active one).
Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType

from hwplug.attention.base import AttentionBackend
from hwplug.attention.torch_backend import TorchAttentionBackend
from hwplug.attention.triton_backend import TritonAttentionBackend
from hwplug.core.errors import ConfigError, PluginError, brief
from hwplug.core.graphs import AttentionGraphSupport
from hwplug.core.names import is_name
from hwplug.core.session import SessionProtocol, active_session

__all__ = [
    "BUILTIN_BACKENDS",
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


def collect_backends(
    builtins: Mapping[str, type[AttentionBackend]],
    plugin_results: Iterable[tuple[str, str, object]],
) -> dict[str, type[AttentionBackend]]:
    """The built-ins plus every class the plugins returned, by name.

    ``plugin_results`` holds ``(plugin name, distribution, returned value)``
    for each ``hwplug_attention_backends()`` implementation (distribution ""
    when unknown). A plugin returning one class several times is harmless.

    :raises PluginError: a result is not a list of ``AttentionBackend``
        subclasses with valid names (naming the plugin), or two different
        classes claim one name (naming both owners).
    """
    table: dict[str, type[AttentionBackend]] = dict(builtins)
    owners = {name: "hwplug's built-in backends" for name in builtins}
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
    return table


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


def get_backend(name: str, session: SessionProtocol | None = None) -> type[AttentionBackend]:
    """The attention backend class called ``name`` in ``session`` (default: the active one).

    :raises ConfigError: unknown name (the message lists the known ones).
    """
    chosen = session if session is not None else active_session()
    return lookup_backend(name, BUILTIN_BACKENDS if chosen is None else chosen.attention_backends())
