"""The resolution pipeline: an engine config in, a config fit for the platform out.

:func:`resolve` takes its collaborators as arguments: the engine config, the
:class:`~hwplug.core.platform.Platform` to resolve for, and the hook relay of
the plugin manager (``pm.hook``) whose extensions may adjust the config.
Turning a platform name into a platform and finding the plugins is the
package face's job (:func:`hwplug.resolve`).

The steps (``docs/concepts.md``):

1. copy, remember what the user set, mirror model fields into the cache;
2. engine defaults from the platform (compilation level, prefix caching,
   chunked prefill, model dtype);
3. graph-mode defaults;
4. the platform's ``check_and_update_config``, then every plugin's
   ``hwplug_check_and_update_config`` hook;
5. finalise: splitting ops, capture sizes, warm-ups, padding table;
6. verify: the checks every platform shares, the platform's own, then every
   ``hwplug_verify_config`` hook.

Config changes go only through :meth:`ChangeLog.record`. After the platform's
step and after every hook implementation the pipeline compares the config
with what was recorded: a change made behind the change log (or any change in
a verify step) is a :class:`~hwplug.PluginError` naming the culprit.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import copy
import dataclasses
import enum
import functools
import json
import logging
import pathlib
import re
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, cast

from hwplug.core.config import CompilationLevel, CUDAGraphMode
from hwplug.core.dtypes import CACHE_DTYPE_FORMATS
from hwplug.core.errors import ConfigError, PluginError, brief, error_line, one_line
from hwplug.core.graph_modes import resolve_runtime_graph_mode
from hwplug.core.graphs import AttentionGraphSupport
from hwplug.core.hookcall import call_hook

if TYPE_CHECKING:
    from pluggy import HookImpl

    from hwplug.core.config import EngineConfig
    from hwplug.core.platform import Platform

__all__ = [
    "ENGINE",
    "Change",
    "ChangeLog",
    "Resolution",
    "explicit_mode_problem",
    "resolve",
    "user_set_fields",
]

ENGINE = "engine"
"""Source of the changes the pipeline makes itself."""

# HWPLUG_TRACE: which plugin's implementation of a config hook runs.
_trace = logging.getLogger("hwplug.trace")

# Values that mean "decide for me": a field given one of them is still unset.
_DECIDE_FOR_ME = (None, "auto")

# Who is changing the config right now (a plugin name, platform:<name>, engine).
_source: contextvars.ContextVar[str] = contextvars.ContextVar(
    "hwplug_change_source", default=ENGINE
)


def _jsonable(value: Any) -> Any:
    """The config's JSON form of a value (imported late: it needs pydantic)."""
    # lazy: pydantic; `import hwplug` stays light
    from hwplug.core.config._common import jsonable

    return jsonable(value)


@dataclasses.dataclass(frozen=True)
class Change:
    """One change made while resolving a config.

    ``path`` is ``section.field``; ``source`` is ``engine`` for the pipeline's
    own steps, ``platform:<name>`` for the active platform, or the registered
    name of the plugin whose hook made it.
    """

    path: str
    old: Any
    new: Any
    source: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict with keys path, old, new, source, reason."""
        return {
            "path": self.path,
            "old": _jsonable(self.old),
            "new": _jsonable(self.new),
            "source": self.source,
            "reason": self.reason,
        }

    def __str__(self) -> str:
        return (
            f"{self.path}: {_short(self.old)} -> {_short(self.new)} [{self.source}] {self.reason}"
        )


def _short(value: Any, limit: int = 60) -> str:
    text = json.dumps(_jsonable(value))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _change_text(old: Any, new: Any, limit: int = 60) -> str:
    """``old -> new`` for a person: each value shortened, unless shortening would make
    two different values read the same; then a list change says what it added and
    removed, and any other value is shown whole."""
    before, after = _short(old, limit), _short(new, limit)
    if before != after or _jsonable(old) == _jsonable(new):
        return f"{before} -> {after}"
    if isinstance(old, list | tuple) and isinstance(new, list | tuple):
        added = [json.dumps(_jsonable(x)) for x in new if x not in old]
        removed = [json.dumps(_jsonable(x)) for x in old if x not in new]
        what = [f"+{x}" for x in added] + [f"-{x}" for x in removed]
        if not what:
            what = ["same items, new order"]
        return f"{len(old)} items -> {len(new)} items ({', '.join(what)})"
    return f"{json.dumps(_jsonable(old))} -> {json.dumps(_jsonable(new))}"


_SECTIONS: dict[type, tuple[str, ...]] = {}


def _section_names(config: EngineConfig) -> tuple[str, ...]:
    names = _SECTIONS.get(type(config))
    if names is None:
        names = _SECTIONS[type(config)] = tuple(type(config).section_types())
    return names


def _sections(config: EngineConfig) -> dict[str, Any]:
    return {name: getattr(config, name) for name in _section_names(config)}


def user_set_fields(config: EngineConfig) -> frozenset[str]:
    """Paths (``section.field``) the user set explicitly.

    A field is set when the user gave it (a constructor argument, an
    assignment, a key of the dict or file the config came from, a ``--set``),
    whatever its value, the default value included. A field given ``None``
    or ``"auto"`` (the values that ask the platform to decide) counts as unset.
    """
    paths = set()
    for section, part in _sections(config).items():
        for name in part.given_fields():
            if getattr(part, name) not in _DECIDE_FOR_ME:
                paths.add(f"{section}.{name}")
    return frozenset(paths)


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(section_type: type) -> tuple[str, ...]:
    """The field names of a config section class (asked on every guarded step)."""
    names = _FIELD_NAMES.get(section_type)
    if names is None:
        names = _FIELD_NAMES[section_type] = tuple(f.name for f in dataclasses.fields(section_type))
    return names


_ATOMIC = (type(None), bool, int, float, complex, str, bytes, enum.Enum)
# Types whose values _state keeps without a call: the usual ones, and enums met since.
_PLAIN = {type(None), bool, int, float, str, frozenset}
_FLAT = (list, dict, set, collections.Counter)


def _atomic_type(kind: type) -> bool:
    return issubclass(kind, _ATOMIC)


@functools.cache
def _section_base() -> type:
    # lazy: pydantic; `import hwplug` stays light
    from hwplug.core.config._common import ConfigSection

    return ConfigSection


def _frozen(value: Any) -> Any:
    """``value`` as it is now, unaffected by later changes in place: itself when it cannot
    change in place, a shallow copy of a list, dict or set of such values, a config
    section copied the same way, else a deep copy."""
    kind = type(value)
    if kind in _FLAT:
        items = value.values() if isinstance(value, dict) else value
        if all(map(_atomic_type, set(map(type, items)))):
            if kind is collections.Counter:  # Counter.copy() is slow Python code
                twin = kind.__new__(kind)
                dict.update(twin, value)
                return twin
            return value.copy()
    elif kind is tuple:
        if all(map(_atomic_type, set(map(type, value)))):
            return value
    elif isinstance(value, _ATOMIC):
        if isinstance(value, enum.Enum):
            _PLAIN.add(kind)
        return value
    elif isinstance(value, _section_base()):
        twin = object.__new__(kind)
        vars(twin).update(_state(value))
        return twin
    return copy.deepcopy(value)


def _immutable_annotation(annotation: Any) -> bool:
    """Whether a field annotated ``annotation`` can only hold values that cannot
    change in place (numbers, strings, enums, paths, None, literals, and unions
    and tuples of those); anything else counts as mutable."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _immutable_annotation(typing.get_args(annotation)[0])
    if origin is typing.Literal:
        return True
    if origin in (typing.Union, types.UnionType, tuple, frozenset):
        return all(
            arg is Ellipsis or _immutable_annotation(arg) for arg in typing.get_args(annotation)
        )
    return isinstance(annotation, type) and issubclass(annotation, (*_ATOMIC, pathlib.PurePath))


_MUTABLE_FIELDS: dict[type, tuple[str, ...]] = {}


def _mutable_fields(section_type: type) -> tuple[str, ...]:
    """The fields of a config section class whose values may change in place."""
    names = _MUTABLE_FIELDS.get(section_type)
    if names is None:
        fields = getattr(section_type, "__pydantic_fields__", {})
        names = _MUTABLE_FIELDS[section_type] = tuple(
            name
            for name in _field_names(section_type)
            if name not in fields or not _immutable_annotation(fields[name].annotation)
        )
    return names


def _state(part: Any) -> dict[str, Any]:
    """A config section's attributes as they are now (see :func:`_frozen`): a shallow
    copy, with the values of fields that may change in place frozen."""
    state = dict(vars(part))
    for name in _mutable_fields(type(part)):
        value = state.get(name)
        if type(value) not in _PLAIN:
            state[name] = _frozen(value)
    return state


def _working_copy(config: EngineConfig) -> EngineConfig:
    """An independent copy of ``config``, section by section (a generic deep copy was
    the slowest step of resolving a small config)."""
    work: EngineConfig = _frozen(config)
    return work


def _same(old: Any, new: Any) -> bool:
    # repr() too: a NaN inside a value is the same value, though NaN != NaN.
    return type(old) is type(new) and (bool(old == new) or repr(old) == repr(new))


def _only_adds_keys(old: Any, new: Any) -> bool:
    """Whether ``new`` is the dict ``old`` with keys added (every old key kept as it was)."""
    return (
        isinstance(old, dict)
        and isinstance(new, dict)
        and all(key in new and _same(value, new[key]) for key, value in old.items())
    )


class ChangeLog:
    """Records and applies the changes made to a config during resolution.

    Platforms and plugins receive it as ``changes``; they change the working
    config only through :meth:`record`.
    """

    def __init__(self, config: EngineConfig, user_set: frozenset[str] | None = None) -> None:
        self._config = config
        self.user_set: frozenset[str] = (
            user_set_fields(config) if user_set is None else frozenset(user_set)
        )
        self._user_values = {
            path: _frozen(self.get(path)) for path in self.user_set if self._known(path)
        }
        self.changes: list[Change] = []

    def __iter__(self) -> Iterator[Change]:
        return iter(self.changes)

    def __len__(self) -> int:
        return len(self.changes)

    def _known(self, path: str) -> bool:
        try:
            self._locate(path)
        except ConfigError:
            return False
        return True

    def _locate(self, path: str) -> tuple[Any, str]:
        sections = _section_names(self._config)
        section, sep, name = path.partition(".")
        if not sep or section not in sections:
            raise ConfigError(
                f"change path {path!r} must be 'section.field' with section one of: "
                f"{', '.join(sections)}"
            )
        part = getattr(self._config, section)
        names = _field_names(type(part))
        if name not in names:
            raise ConfigError(
                f"change path {path!r}: {section} has no field {name!r}; fields: {', '.join(names)}"
            )
        return part, name

    def get(self, path: str) -> Any:
        """The current value at ``section.field``."""
        part, name = self._locate(path)
        return getattr(part, name)

    def was_set(self, path: str) -> bool:
        """Whether the user set ``section.field`` (gave it, whatever the value)."""
        self._locate(path)
        return path in self.user_set

    def record(self, path: str, new: Any, reason: str, source: str | None = None) -> None:
        """Set ``section.field`` to ``new`` and log the change with ``reason``.

        ``source`` defaults to whoever is running: ``platform:<name>`` inside the
        active platform's ``check_and_update_config``, the plugin's registered
        name inside a hook implementation, ``engine`` in the pipeline. Setting a
        field to its current value records nothing.

        :raises ConfigError: the user set ``path`` (replacing a user's choice is
            never silent; a dict the user gave may only gain keys), or ``new``
            is not a valid value for it.
        """
        part, name = self._locate(path)
        old = getattr(part, name)
        if _same(old, new):
            return
        who = source if source is not None else _source.get()
        if path in self.user_set and not _only_adds_keys(old, new):
            raise ConfigError(
                f"{who} wants {path}={brief(_jsonable(new))}, but the user set "
                f"{path}={brief(_jsonable(self._user_values.get(path, old)))}; an explicit "
                f"choice is honoured or refused, never replaced (raise ConfigError in {who} "
                "if the value cannot work)"
            )
        try:
            setattr(part, name, new)
        except ValueError as exc:
            raise ConfigError(
                f"{who} set {path} to {brief(new)}, which is invalid: {one_line(str(exc))}"
            ) from exc
        self.note(path, old, _frozen(getattr(part, name)), reason, who)

    def note(self, path: str, old: Any, new: Any, reason: str, source: str | None = None) -> None:
        """Log a change that was already applied (by a config method, say)."""
        if _same(old, new):
            return
        who = source if source is not None else _source.get()
        self.changes.append(Change(path, _frozen(old), new, who, reason))

    # -- guarding against changes made behind the log ------------------------------
    def _snapshot(self) -> dict[str, tuple[Any, dict[str, Any]]]:
        """Every section (the object and its attributes) as it is now."""
        return {name: (part, _state(part)) for name, part in _sections(self._config).items()}

    def _differences(self, before: dict[str, tuple[Any, dict[str, Any]]]) -> list[str]:
        """The fields (``section.field``) that differ from ``before``."""
        wrong = []
        for section, (old_part, old_state) in before.items():
            part = getattr(self._config, section)
            if part is old_part and vars(part) == old_state:
                continue  # the usual case: one comparison for the whole section
            for name in _field_names(type(part)):
                old, new = old_state.get(name), getattr(part, name)
                if old is not new and not _same(old, new):
                    wrong.append(f"{section}.{name}")
        return wrong

    def _unrecorded(self, before: dict[str, tuple[Any, dict[str, Any]]], since: int) -> list[str]:
        """Fields that differ from ``before`` other than through :meth:`record` since
        change number ``since``."""
        recorded = {change.path: change.new for change in self.changes[since:]}
        return [
            path
            for path in self._differences(before)
            if not (path in recorded and _same(recorded[path], self.get(path)))
        ]

    def _before(self, before: dict[str, tuple[Any, dict[str, Any]]], path: str) -> Any:
        section, _, name = path.partition(".")
        return before[section][1].get(name)


@dataclasses.dataclass
class Resolution:
    """The outcome of :func:`resolve`: the resolved config, the platform, the changes."""

    config: EngineConfig
    platform: Platform
    changes: list[Change]

    def changes_to(self, path: str) -> list[Change]:
        """The changes made to ``section.field``, in order."""
        return [c for c in self.changes if c.path == path]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``platform``, ``config`` (dict of sections) and ``changes``."""
        return {
            "platform": self.platform.name,
            "config": self.config.to_dict(),
            "changes": [c.to_dict() for c in self.changes],
        }

    def explain(self) -> str:
        """A readable account of what resolution changed and why."""
        plat = self.platform
        where = f"simulated {plat.profile}" if plat.simulated else "detected hardware"
        lines = [f"Resolved for platform {plat.name!r} ({plat.describe_device()}, {where})."]
        if not self.changes:
            lines.append("No changes: the configuration was already complete.")
            return "\n".join(lines)
        lines.append(f"{len(self.changes)} change(s):")
        width = max(len(c.path) for c in self.changes)
        for c in self.changes:
            lines.append(
                f"  {c.path:<{width}}  {_change_text(c.old, c.new)}  [{c.source}] {c.reason}"
            )
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.explain()


# ---------------------------------------------------------------------------
# Running platform steps and hook implementations under guard
# ---------------------------------------------------------------------------

Describe = Callable[[str], str]
"""Turns a source (a plugin name or ``platform:<name>``) into a description for
messages, such as ``'acme_npu' (distribution acme-npu)``."""


def _plain(source: str) -> str:
    return repr(source)


@dataclasses.dataclass
class _Step:
    """The state one guarded step needs: the change log, the phase, how to name people."""

    changes: ChangeLog
    phase: str
    describe: Describe
    may_change: bool = True


_step: contextvars.ContextVar[_Step | None] = contextvars.ContextVar(
    "hwplug_resolve_step", default=None
)


@contextlib.contextmanager
def _acting_as(source: str) -> Iterator[None]:
    """Run the block as ``source``: its records are attributed to it, and a change
    it makes behind the change log (or any change in a verify step) is its fault."""
    token = _source.set(source)
    step = _step.get()
    before = step.changes._snapshot() if step is not None else None
    since = len(step.changes.changes) if step is not None else 0
    try:
        yield
    except (ConfigError, PluginError):
        raise
    except BaseException as exc:
        # A plugin's failure, sys.exit() included, becomes a PluginError naming it;
        # only the user's interrupt and generator shutdown pass through untouched.
        if step is None or isinstance(exc, KeyboardInterrupt | GeneratorExit):
            raise
        raise PluginError(
            f"{_who(source, step.describe)} failed in {step.phase}: {error_line(exc)}"
        ) from exc
    finally:
        _source.reset(token)
    if step is not None and before is not None:
        _check_unrecorded(step, source, before, since)


def _who(source: str, describe: Describe) -> str:
    if source.startswith("platform:"):
        return f"platform {describe(source)}"
    return f"plugin {describe(source)}"


def _check_unrecorded(
    step: _Step, source: str, before: dict[str, tuple[Any, dict[str, Any]]], since: int
) -> None:
    if step.may_change:
        wrong = step.changes._unrecorded(before, since)
        how = "behind the change log; change fields only through changes.record(path, new, reason)"
    else:
        wrong = step.changes._differences(before)
        how = "although verification must not change the config; raise ConfigError instead"
    if not wrong:
        return
    details = ", ".join(
        f"{path} ({brief(_jsonable(step.changes._before(before, path)))} -> "
        f"{brief(_jsonable(step.changes.get(path)))})"
        for path in wrong
    )
    raise PluginError(f"{_who(source, step.describe)} changed {details} in {step.phase} {how}")


@contextlib.contextmanager
def _guarded(
    changes: ChangeLog, phase: str, describe: Describe, *, may_change: bool
) -> Iterator[None]:
    token = _step.set(_Step(changes, phase, describe, may_change))
    try:
        yield
    finally:
        _step.reset(token)


def _call_hook(hooks: Any, name: str, **kwargs: Any) -> None:
    """Call every implementation of hook ``name`` as pluggy would, each part of
    each one running as its plugin, under guard."""
    if hooks is None:
        return
    _trace.debug("%s", name)

    def run(impl: HookImpl, call: Callable[[], Any]) -> Any:
        _trace.debug("  %s: plugin %s", name, impl.plugin_name)
        with _acting_as(impl.plugin_name):
            return call()

    call_hook(getattr(hooks, name), kwargs, run)


# ---------------------------------------------------------------------------
# The pipeline
# ---------------------------------------------------------------------------


def resolve(
    config: EngineConfig,
    platform: Platform,
    hooks: Any = None,
    *,
    describe: Describe | None = None,
    attention_backends: Mapping[str, Any] | None = None,
) -> Resolution:
    """Resolve ``config`` for ``platform``, with the extensions in ``hooks``.

    ``hooks`` is the hook relay of a plugin manager (``pm.hook``) or None (no
    extensions); ``describe`` names a plugin or ``platform:<name>`` in
    messages (with its distribution, say); ``attention_backends`` maps
    backend names to ``AttentionBackend`` classes (None: no attention step).
    The caller's config is never mutated. Deterministic: same input, same
    output.

    :raises ConfigError: the config cannot run on the platform.
    :raises PluginError: the platform or a plugin misbehaved (raised, or
        changed the config behind the change log).
    """
    # lazy: pydantic; `import hwplug` stays light
    from hwplug.core.config import EngineConfig

    if not isinstance(config, EngineConfig):
        raise ConfigError(
            f"resolve() expects an EngineConfig (or None for the defaults), "
            f"got {type(config).__name__}"
        )
    name = describe or _plain
    work = _working_copy(config)
    changes = ChangeLog(work)
    _step_copy(work, changes)
    _step_defaults(work, platform, changes)
    _step_graph_defaults(work, platform, changes)
    with _guarded(changes, "check_and_update_config", name, may_change=True):
        with _acting_as(f"platform:{platform.name}"):
            platform.check_and_update_config(work, changes)
        _call_hook(
            hooks, "hwplug_check_and_update_config", config=work, platform=platform, changes=changes
        )
    backend = None
    if attention_backends is not None:
        backend = _step_attention(work, platform, changes, attention_backends)
    _step_finalise(work, platform, changes, backend)
    _step_shared_checks(work)
    _step_fp8_name(work, platform, changes)
    try:
        with _guarded(changes, "verify_config", name, may_change=False):
            with _acting_as(f"platform:{platform.name}"):
                platform.verify_config(work)
            _call_hook(hooks, "hwplug_verify_config", config=work, platform=platform)
    except ConfigError as exc:
        raise _with_provenance(exc, changes) from exc
    return Resolution(work, platform, list(changes.changes))


_FIELD = re.compile(r"\b([a-z_]+\.[a-z_]+)=")


def _with_provenance(exc: ConfigError, changes: ChangeLog) -> ConfigError:
    """``exc`` saying who set each field it names that the user did not set (a refusal of
    a value the platform or a plugin filled must not read as the user's mistake)."""
    message = str(exc)
    notes = []
    for path in dict.fromkeys(_FIELD.findall(message)):
        if changes.was_set(path):
            continue
        made = [c for c in changes.changes if c.path == path]
        if made:
            last = made[-1]
            notes.append(f"{path} was set by {last.source} ({last.reason}), not by the user")
    if not notes:
        return exc
    return ConfigError(f"{message} [{'; '.join(notes)}]")


def _step_fp8_name(config: EngineConfig, platform: Platform, changes: ChangeLog) -> None:
    """A cache dtype that means "the platform's fp8" needs the platform to name one."""
    cache_dtype = config.cache.cache_dtype
    fmt = CACHE_DTYPE_FORMATS.get(cache_dtype)
    if fmt is None or fmt.torch_name is not None or cache_dtype == "auto":
        return
    problem = platform.fp8_name_problem()
    if problem is not None:
        raise ConfigError(
            f"cache.cache_dtype={cache_dtype!r} (set by {_who_set(changes, 'cache.cache_dtype')}) "
            f"cannot be used on {platform.describe_device()}: {problem}; use cache.cache_dtype="
            "'auto' or 'bfloat16'"
        )


def _step_copy(config: EngineConfig, changes: ChangeLog) -> None:
    """Step 1: mirror the model's attention facts into the cache config.

    A cache value the user set is kept; one that contradicts the model's
    (both set, different) is a ``ConfigError``.
    """
    for name in ("sliding_window", "is_attention_free"):
        model_path, cache_path = f"model.{name}", f"cache.{name}"
        model_value = changes.get(model_path)
        if changes.was_set(cache_path):
            cache_value = changes.get(cache_path)
            if changes.was_set(model_path) and not _same(model_value, cache_value):
                raise ConfigError(
                    f"{cache_path}={brief(cache_value)} contradicts {model_path}="
                    f"{brief(model_value)}; set only {model_path} (the cache mirrors it)"
                )
            continue
        changes.record(cache_path, model_value, f"mirrors {model_path}", source=ENGINE)


def _step_defaults(config: EngineConfig, plat: Platform, changes: ChangeLog) -> None:
    """Step 2: compilation level, prefix caching, chunked prefill and model dtype."""
    level = config.compilation.level
    if level is None:
        if config.model.enforce_eager:
            changes.record(
                "compilation.level",
                int(CompilationLevel.NO_COMPILATION),
                "model.enforce_eager disables compilation",
            )
        else:
            changes.record(
                "compilation.level",
                int(plat.default_compilation_level),
                f"default compilation level on {plat.name}",
            )
    else:
        problem = plat.compilation_level_problem(int(level))
        if problem is not None:
            raise ConfigError(problem)

    if config.cache.enable_prefix_caching is None:
        value, reason = plat.default_prefix_caching(config)
        changes.record("cache.enable_prefix_caching", value, reason)
    if config.scheduler.enable_chunked_prefill is None:
        value, reason = plat.default_chunked_prefill(config)
        changes.record("scheduler.enable_chunked_prefill", value, reason)
    if config.model.dtype == "auto":
        dtypes = plat.supported_model_dtypes()
        if not dtypes:
            raise ConfigError(f"{plat.describe_device()} supports no model dtype")
        changes.record(
            "model.dtype",
            dtypes[0],
            f"preferred model dtype on {plat.describe_device()}",
        )


def explicit_mode_problem(config: EngineConfig, plat: Platform) -> str | None:
    """Why an explicit ``compilation.cudagraph_mode`` cannot run on ``plat``, or None."""
    mode = config.compilation.cudagraph_mode
    if mode is None or mode == CUDAGraphMode.NONE:
        return None
    device = plat.describe_device()
    if not plat.has_device_graphs():
        return (
            f"compilation.cudagraph_mode={mode} is not supported on {device}: the "
            f"{plat.name} platform has no device graphs; use NONE"
        )
    if config.model.enforce_eager:
        return (
            f"compilation.cudagraph_mode={mode} contradicts model.enforce_eager=True; "
            "set compilation.cudagraph_mode=NONE or model.enforce_eager=False"
        )
    if mode.requires_piecewise_compilation() and not plat.supports_piecewise_graphs:
        return (
            f"compilation.cudagraph_mode={mode} is not supported on {device}: {plat.name} "
            "graphs capture the whole forward pass only; use FULL or NONE"
        )
    return None


def _step_graph_defaults(config: EngineConfig, plat: Platform, changes: ChangeLog) -> None:
    """Step 3: the graph-capture mode."""
    comp = config.compilation
    if comp.cudagraph_mode is not None:
        problem = explicit_mode_problem(config, plat)
        if problem is not None:
            raise ConfigError(problem)
        return
    if not plat.has_device_graphs():
        new, reason = CUDAGraphMode.NONE, f"{plat.name} has no device graphs"
    elif config.model.enforce_eager:
        new, reason = CUDAGraphMode.NONE, "model.enforce_eager disables graph capture"
    elif comp.level == CompilationLevel.PIECEWISE and plat.supports_piecewise_graphs:
        new, reason = (
            CUDAGraphMode.FULL_AND_PIECEWISE,
            "full graphs for decode, piecewise graphs for mixed batches at level PIECEWISE",
        )
    elif not plat.graphs_need_compilation:
        new, reason = CUDAGraphMode.FULL, f"{plat.name} captures the whole forward pass"
    else:
        new, reason = CUDAGraphMode.NONE, "graphs need compilation level PIECEWISE"
    changes.record("compilation.cudagraph_mode", new, reason)


_PIECEWISE_SENSITIVE = ("compilation.cudagraph_mode", "compilation.splitting_ops")


def _who_set(changes: ChangeLog, path: str) -> str:
    if changes.was_set(path):
        return "the user"
    sources = [c.source for c in changes.changes if c.path == path]
    return sources[-1] if sources else "the user"


def _step_attention(
    config: EngineConfig, plat: Platform, changes: ChangeLog, backends: Mapping[str, Any]
) -> Any:
    """Step 4b: choose or check ``attention.backend``; the chosen class or None."""
    import logging

    path = "attention.backend"
    name = config.attention.backend
    model = config.model
    if model.is_attention_free:
        return None  # an explicit backend is kept as given, unchecked and unused
    device = plat.describe_device()
    order = tuple(plat.attention_backends(config))

    def problem_of(backend: str) -> str | None:
        # A session's backend table (hwplug.attention.BackendTable) also knows which
        # platforms each backend serves and who provides it; a plain mapping does not.
        scoped = getattr(backends, "problem", None)
        if callable(scoped):
            return cast("str | None", scoped(backend, config, plat))
        return cast("str | None", backends[backend].problem(config, plat))

    def serves(backend: str) -> bool:
        scoped = getattr(backends, "serves", None)
        return bool(scoped(backend, plat)) if callable(scoped) else True

    if name is None:
        skipped: list[str] = []
        for candidate in order:
            cls = backends.get(candidate)
            problem = (
                f"no attention backend {candidate!r} is installed"
                if cls is None
                else problem_of(candidate)
            )
            if problem is None:
                why = f"first of {plat.name}'s attention order ({', '.join(order)}) that fits"
                if skipped:
                    why += "; skipped " + "; ".join(skipped)
                changes.record(path, candidate, why, source=ENGINE)
                return cls
            skipped.append(f"{candidate}: {problem}")
        if model.use_mla:
            logging.getLogger("hwplug.resolve").warning(
                "no built-in attention backend serves MLA models on %s; attention.backend stays "
                "unset (the engine brings its own MLA attention, or a plugin's backend serves it)",
                device,
            )
            return None
        raise ConfigError(
            f"no attention backend can serve this model on {device}: "
            + "; ".join(skipped or [f"{plat.name} names no attention backend"])
            + "; change the model, cache or block settings, or install a backend that fits"
        )
    who = _who_set(changes, path)
    cls = backends.get(name)
    problem = (
        f"it is not installed (backends for platform {plat.name!r}: "
        f"{', '.join(sorted(n for n in backends if serves(n))) or 'none'})"
        if cls is None
        else problem_of(name)
    )
    if problem is None:
        return cls
    working = [
        n
        for n in (*order, *sorted(set(backends) - set(order)))
        if n in backends and n != name and problem_of(n) is None
    ]
    raise ConfigError(
        f"attention.backend={name!r} (set by {who}) cannot run on {device}: {problem}; "
        + (
            f"use attention.backend={working[0]!r}"
            + (f" (or {', '.join(repr(w) for w in working[1:])})" if working[1:] else "")
            if working
            else "no installed backend fits"
        )
    )


def _step_fit_graph_mode(
    config: EngineConfig, plat: Platform, changes: ChangeLog, backend: Any
) -> None:
    """Attention step 2: fit the graph mode to the attention backend's graph support."""
    comp = config.compilation
    mode = comp.cudagraph_mode
    if backend is None or mode is None or mode == CUDAGraphMode.NONE:
        return
    if not plat.fits_graph_mode_to_attention:
        return
    support = backend.graph_support
    path = "compilation.cudagraph_mode"
    explicit = changes.was_set(path)
    _fit_piecewise_capture(config, plat, changes, backend)
    mode = comp.cudagraph_mode
    if mode is None or mode == CUDAGraphMode.NONE:
        return
    try:
        fitted = resolve_runtime_graph_mode(comp, support)
    except ConfigError as exc:
        if explicit:
            raise ConfigError(
                f"compilation.cudagraph_mode={mode} cannot run with the {backend.name} attention "
                f"backend (graph support {support.name}): {exc}"
            ) from exc
        fitted = CUDAGraphMode.NONE
    if _captures_attention_piecewise(comp, fitted, support):
        # degraded to piecewise graphs, but hwplug's attention is not split out of them
        fitted = CUDAGraphMode.NONE
    if fitted == mode:
        return
    if explicit:
        working = _modes_that_fit(config, plat, support)
        raise ConfigError(
            f"compilation.cudagraph_mode={mode} cannot run with the {backend.name} attention "
            f"backend on {plat.describe_device()}: its graph support is {support.name}, so "
            f"the mode would become {fitted}; use compilation.cudagraph_mode="
            + " or ".join(m.name for m in working)
            + ", or another attention.backend"
        )
    changes.record(
        path,
        fitted,
        f"the {backend.name} attention backend's graph support is {support.name}",
        source=ENGINE,
    )


def _attention_split(comp: Any) -> bool:
    """Whether piecewise compilation runs hwplug's attention ops outside the captured
    pieces: level PIECEWISE with every one of them among the splitting ops."""
    ops = comp.splitting_ops or []
    return comp.level == CompilationLevel.PIECEWISE and all(
        op in ops for op in _HWPLUG_ATTENTION_OPS
    )


def _captures_attention_piecewise(comp: Any, mode: Any, support: Any) -> bool:
    """Whether ``mode``'s piecewise graphs would capture an attention backend of
    ``support`` that cannot run inside a captured graph (below ALWAYS)."""
    return (
        mode.has_piecewise_cudagraphs()
        and support is not AttentionGraphSupport.ALWAYS
        and not _attention_split(comp)
    )


def _fit_piecewise_capture(
    config: EngineConfig, plat: Platform, changes: ChangeLog, backend: Any
) -> None:
    """Piecewise graphs that would capture attention (hwplug's ops are not split out)
    need a backend that can run inside any captured graph (ALWAYS): else an explicit
    mode is a ConfigError, and an unset one drops its piecewise graphs (recorded)."""
    comp = config.compilation
    mode = comp.cudagraph_mode
    support = backend.graph_support
    if mode is None or not _captures_attention_piecewise(comp, mode, support):
        return
    missing = [op for op in _HWPLUG_ATTENTION_OPS if op not in (comp.splitting_ops or [])]
    why = (
        f"compilation.splitting_ops={comp.splitting_ops} leave {', '.join(missing)} inside "
        f"the piecewise graphs, which would capture the {backend.name} attention backend "
        f"(graph support {support.name}: it cannot run inside a captured graph)"
    )
    path = "compilation.cudagraph_mode"
    if changes.was_set(path):
        fixes = [f"add {', '.join(missing)} to compilation.splitting_ops"]
        if support >= AttentionGraphSupport.UNIFORM_SINGLE_TOKEN_DECODE:
            fixes.append("use compilation.cudagraph_mode=FULL_DECODE_ONLY")
        fixes += ["use compilation.cudagraph_mode=NONE", "choose another attention.backend"]
        raise ConfigError(
            f"compilation.cudagraph_mode={mode} cannot run on {plat.describe_device()}: "
            f"{why}; " + ", or ".join(fixes)
        )
    if mode == CUDAGraphMode.FULL_AND_PIECEWISE and support is not AttentionGraphSupport.NEVER:
        fitted = CUDAGraphMode.FULL_DECODE_ONLY
    else:
        fitted = CUDAGraphMode.NONE
    changes.record(path, fitted, why, source=ENGINE)


def _modes_that_fit(config: EngineConfig, plat: Platform, support: Any) -> list[Any]:
    """The graph modes the platform accepts here and the attention support keeps as they are."""
    kept = []
    for candidate in CUDAGraphMode:
        trial = copy.deepcopy(config)
        trial.compilation.cudagraph_mode = candidate
        if explicit_mode_problem(trial, plat) is not None:
            continue
        if (
            candidate.requires_piecewise_compilation()
            and trial.compilation.level != CompilationLevel.PIECEWISE
        ):
            continue
        if _captures_attention_piecewise(trial.compilation, candidate, support):
            continue
        try:
            if resolve_runtime_graph_mode(trial.compilation, support) == candidate:
                kept.append(candidate)
        except ConfigError:
            continue
    return kept


# hwplug's attention op and its variant that writes into an output buffer.
_HWPLUG_ATTENTION_OPS = ("hwplug.unified_attention", "hwplug.unified_attention_with_output")


def _step_finalise(
    config: EngineConfig, plat: Platform, changes: ChangeLog, backend: Any = None
) -> None:
    """Step 5: splitting ops, graph-mode fitting, capture sizes, warm-ups, padding table."""
    comp = config.compilation
    mode = comp.cudagraph_mode if comp.cudagraph_mode is not None else CUDAGraphMode.NONE
    if mode.requires_piecewise_compilation() and comp.level != CompilationLevel.PIECEWISE:
        raise ConfigError(
            f"compilation.cudagraph_mode={mode} needs piecewise compilation, but "
            f"compilation.level={comp.level}; set compilation.level=3 (PIECEWISE) or "
            "compilation.cudagraph_mode=FULL or NONE"
        )

    if comp.level == CompilationLevel.PIECEWISE:
        before = {p: _frozen(changes.get(p)) for p in _PIECEWISE_SENSITIVE}
        comp.set_splitting_ops_for_v1()
        for path in _PIECEWISE_SENSITIVE:
            after = changes.get(path)
            if _same(before[path], after):
                continue
            if changes.was_set(path):
                raise ConfigError(_splitting_conflict(path, before[path], after, comp))
            changes.note(path, before[path], _frozen(after), _splitting_reason(path, comp))
        missing = [op for op in _HWPLUG_ATTENTION_OPS if op not in (comp.splitting_ops or [])]
        if (
            backend is not None
            and comp.splitting_ops
            and not changes.was_set("compilation.splitting_ops")
            and missing
        ):
            changes.record(
                "compilation.splitting_ops",
                [*comp.splitting_ops, *missing],
                f"split at hwplug's attention op too (the {backend.name} backend runs in it)",
                source=ENGINE,
            )

    _step_fit_graph_mode(config, plat, changes, backend)

    scheduler = config.scheduler
    if not changes.was_set("scheduler.cuda_graph_sizes"):
        changes.record(
            "scheduler.cuda_graph_sizes",
            [scheduler.default_graph_size()],
            "min(2 x scheduler.max_num_seqs, 512)",
        )

    mode = comp.cudagraph_mode if comp.cudagraph_mode is not None else CUDAGraphMode.NONE
    graphs_on = (
        plat.has_device_graphs() and mode != CUDAGraphMode.NONE and not config.model.enforce_eager
    )
    sizes_before = _frozen(comp.cudagraph_capture_sizes)
    compile_before = _frozen(comp.compile_sizes)
    sizes = config.default_cudagraph_capture_sizes() if graphs_on else []
    comp.init_with_cudagraph_sizes(sizes)
    # Normalising what the user gave (dedupe, sort, expand) is not a change.
    if not changes.was_set("compilation.cudagraph_capture_sizes"):
        reason = (
            f"from scheduler.cuda_graph_sizes={scheduler.cuda_graph_sizes} "
            f"and max_num_batched_tokens={scheduler.max_num_batched_tokens}"
            if graphs_on
            else "graphs are off: nothing to capture"
        )
        changes.note(
            "compilation.cudagraph_capture_sizes",
            sizes_before,
            _frozen(comp.cudagraph_capture_sizes),
            reason,
        )
    if not changes.was_set("compilation.compile_sizes"):
        changes.note(
            "compilation.compile_sizes",
            compile_before,
            _frozen(comp.compile_sizes),
            "sizes for Inductor: 'cudagraph_capture_sizes' expanded, duplicates removed"
            if compile_before is not None
            else "no sizes for Inductor to specialise for",
        )
    if (
        graphs_on
        and comp.cudagraph_num_of_warmups == 0
        and not changes.was_set("compilation.cudagraph_num_of_warmups")
    ):
        changes.record(
            "compilation.cudagraph_num_of_warmups",
            1,
            "one eager warm-up run before each capture",
        )


def _step_shared_checks(config: EngineConfig) -> None:
    """Step 6, first part: the checks every platform shares (platforms.md)."""
    scheduler, model = config.scheduler, config.model
    tokens = scheduler.max_num_batched_tokens
    if not scheduler.enable_chunked_prefill and tokens < model.max_model_len:
        raise ConfigError(
            f"scheduler.max_num_batched_tokens={tokens} is below model.max_model_len="
            f"{model.max_model_len} without chunked prefill, so a prompt of full length could "
            f"never be scheduled; set scheduler.max_num_batched_tokens={model.max_model_len} "
            "(or more), lower model.max_model_len, or set scheduler.enable_chunked_prefill=True"
        )
    if tokens < scheduler.max_num_seqs:
        raise ConfigError(
            f"scheduler.max_num_batched_tokens={tokens} is below scheduler.max_num_seqs="
            f"{scheduler.max_num_seqs}: a step could not hold one token of every sequence; "
            f"set scheduler.max_num_batched_tokens={scheduler.max_num_seqs} (or more), or "
            f"scheduler.max_num_seqs={tokens} (or fewer)"
        )


def _splitting_reason(path: str, comp: Any) -> str:
    if comp.use_inductor_graph_partition:
        return "Inductor graph partition splits at cudagraph-unsafe ops instead"
    if comp.pass_config.enable_attn_fusion:
        return "attention fusion needs attention inside the compiled graph"
    if path == "compilation.splitting_ops":
        return "split the graph at the attention ops for piecewise compilation"
    return "empty splitting_ops leave no piecewise graphs to capture"


def _splitting_conflict(path: str, old: Any, new: Any, comp: Any) -> str:
    if path == "compilation.splitting_ops":
        if comp.use_inductor_graph_partition:
            return (
                f"compilation.splitting_ops={_jsonable(old)} conflicts with "
                "compilation.use_inductor_graph_partition=True, which splits at "
                "cudagraph-unsafe ops itself; leave compilation.splitting_ops unset or []"
            )
        return (
            f"compilation.splitting_ops={_jsonable(old)} cannot be used as given "
            f"(piecewise compilation needs {_jsonable(new)}); leave it unset"
        )
    return (
        f"compilation.cudagraph_mode={_jsonable(old)} needs piecewise graphs, but the "
        f"compilation settings leave none (splitting_ops={_jsonable(comp.splitting_ops)}); "
        f"use compilation.cudagraph_mode={_jsonable(new)}, or leave "
        "compilation.splitting_ops unset"
    )
