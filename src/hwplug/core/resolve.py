"""The resolution pipeline: an engine config in, a config fit for the platform out.

:func:`resolve` copies the caller's :class:`~hwplug.core.config.EngineConfig`,
fills what the user left unset from the platform's tables, lets the platform
and every extension plugin adjust it, finalises the compilation settings and
verifies the result. Every change is recorded as a :class:`Change` with the
reason and who made it.

The steps (see ``docs/concepts.md``):

1. copy, remember what the user set, mirror model fields into the cache;
2. engine defaults from the platform (compilation level, prefix caching,
   chunked prefill, model dtype);
3. graph-mode defaults;
4. the platform's ``check_and_update_config``, then every plugin's
   ``hwplug_check_and_update_config`` hook;
5. finalise: splitting ops, capture sizes, warm-ups, padding table;
6. verify: the platform, then every ``hwplug_verify_config`` hook.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import dataclasses
import json
import sys
from collections.abc import Iterator
from types import CodeType
from typing import TYPE_CHECKING, Any

from hwplug.core.errors import ConfigError, one_line

if TYPE_CHECKING:
    from hwplug.core.config import EngineConfig
    from hwplug.core.platform import Platform

__all__ = ["Change", "ChangeLog", "Resolution", "resolve", "user_set_fields"]

ENGINE = "engine"
"""Source of the changes the pipeline makes itself."""

SECTIONS = ("model", "cache", "compilation", "parallel", "scheduler")

# Who is changing the config right now: a fixed source, or a map from hook
# implementation code objects to plugin names (resolved by walking the stack).
_source: contextvars.ContextVar[str | dict[CodeType, str]] = contextvars.ContextVar(
    "hwplug_change_source", default=ENGINE
)


def _jsonable(value: Any) -> Any:
    """The config's JSON form of a value (imported late: it needs pydantic)."""
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


def _unset_value(value: Any, default: Any) -> bool:
    return value is None or (isinstance(value, str) and value == "auto") or value == default


def _field_default(field: dataclasses.Field[Any]) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


def user_set_fields(config: EngineConfig) -> frozenset[str]:
    """Paths (``section.field``) the user set explicitly.

    A field counts as unset when it is ``None``, ``"auto"`` or still at its
    default (the "decide for me" value); everything else is a choice that
    resolution must honour or reject, never silently replace.
    """
    paths = set()
    for section in SECTIONS:
        part = getattr(config, section)
        filled = part.unset_values()
        for field in dataclasses.fields(part):
            if not field.init:
                continue
            value = getattr(part, field.name)
            if field.name in filled and value == filled[field.name]:
                continue
            if not _unset_value(value, _field_default(field)):
                paths.add(f"{section}.{field.name}")
    return frozenset(paths)


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
        self.changes: list[Change] = []

    def __iter__(self) -> Iterator[Change]:
        return iter(self.changes)

    def __len__(self) -> int:
        return len(self.changes)

    def _locate(self, path: str) -> tuple[Any, str]:
        section, sep, name = path.partition(".")
        if not sep or section not in SECTIONS:
            raise ConfigError(
                f"change path {path!r} must be 'section.field' with section one of: "
                f"{', '.join(SECTIONS)}"
            )
        part = getattr(self._config, section)
        names = [f.name for f in dataclasses.fields(part)]
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
        """Whether the user set ``section.field`` explicitly (before resolution)."""
        self._locate(path)
        return path in self.user_set

    def record(self, path: str, new: Any, reason: str, source: str | None = None) -> None:
        """Set ``section.field`` to ``new`` and log the change with ``reason``.

        ``source`` defaults to whoever is running: ``platform:<name>`` inside the
        active platform's ``check_and_update_config``, the plugin's registered
        name inside a hook implementation, ``engine`` in the pipeline. Setting a
        field to its current value records nothing.
        """
        part, name = self._locate(path)
        old = getattr(part, name)
        if _same(old, new):
            return
        who = source if source is not None else _current_source()
        try:
            setattr(part, name, new)
        except ValueError as exc:
            raise ConfigError(
                f"{who} set {path} to {new!r}, which is invalid: {one_line(str(exc))}"
            ) from exc
        self.note(path, old, copy.deepcopy(getattr(part, name)), reason, who)

    def note(self, path: str, old: Any, new: Any, reason: str, source: str | None = None) -> None:
        """Log a change that was already applied (by a config method, say)."""
        if _same(old, new):
            return
        who = source if source is not None else _current_source()
        self.changes.append(Change(path, copy.deepcopy(old), new, who, reason))


def _same(old: Any, new: Any) -> bool:
    return type(old) is type(new) and bool(old == new)


def _current_source() -> str:
    source = _source.get()
    if isinstance(source, str):
        return source
    frame = sys._getframe(2)
    while frame is not None:
        name = source.get(frame.f_code)
        if name is not None:
            return name
        frame = frame.f_back  # type: ignore[assignment]
    return ENGINE


@contextlib.contextmanager
def _acting_as(source: str | dict[CodeType, str]) -> Iterator[None]:
    token = _source.set(source)
    try:
        yield
    finally:
        _source.reset(token)


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
                f"  {c.path:<{width}}  {_short(c.old)} -> {_short(c.new)}  [{c.source}] {c.reason}"
            )
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.explain()


# ---------------------------------------------------------------------------
# The pipeline
# ---------------------------------------------------------------------------


def resolve(
    config: EngineConfig | None = None, *, platform: Platform | str | None = None
) -> Resolution:
    """Resolve ``config`` for ``platform`` (default: the current platform).

    The caller's config is never mutated. ``platform`` may be a
    :class:`~hwplug.core.platform.Platform`, a platform name or a profile
    (``"h100:8"``). Raises :class:`~hwplug.ConfigError` when the config cannot
    run on the platform. Deterministic: same input, same output.
    """
    from hwplug.core.config import EngineConfig
    from hwplug.plugins import manager

    if config is None:
        config = EngineConfig()
    elif not isinstance(config, EngineConfig):
        raise ConfigError(
            f"resolve() expects an EngineConfig (or None for the defaults), "
            f"got {type(config).__name__}"
        )
    if platform is None:
        plat = manager.get_platform()
    elif isinstance(platform, str):
        plat = manager.platform_from_spec(platform)
    else:
        plat = platform
    pm = manager.get_plugin_manager()

    work = copy.deepcopy(config)
    changes = ChangeLog(work)
    with _acting_as(ENGINE):
        _step_copy(work, changes)
        _step_defaults(work, plat, changes)
        _step_graph_defaults(work, plat, changes)
    with _acting_as(f"platform:{plat.name}"):
        plat.check_and_update_config(work, changes)
    hook = pm.hook.hwplug_check_and_update_config
    code_map = {impl.function.__code__: impl.plugin_name for impl in hook.get_hookimpls()}
    with _acting_as(code_map):
        _call_hook(
            hook, plugin_kind="check_and_update_config", config=work, platform=plat, changes=changes
        )
    with _acting_as(ENGINE):
        _step_finalise(work, plat, changes)
    plat.verify_config(work)
    _call_hook(
        pm.hook.hwplug_verify_config, plugin_kind="verify_config", config=work, platform=plat
    )
    return Resolution(work, plat, list(changes.changes))


def _call_hook(hook: Any, plugin_kind: str, **kwargs: Any) -> None:
    """Call a config hook; a non-ConfigError failure is reported as the plugin's fault."""
    from hwplug.core.errors import PluginError

    try:
        hook(**kwargs)
    except ConfigError:
        raise
    except PluginError:
        raise
    except Exception as exc:
        culprit = _culprit(exc, hook)
        raise PluginError(
            f"plugin {culprit} failed in hwplug_{plugin_kind}: {type(exc).__name__}: "
            f"{one_line(str(exc))}"
        ) from exc


def _culprit(exc: BaseException, hook: Any) -> str:
    from hwplug.plugins import manager

    codes = {impl.function.__code__: impl.plugin_name for impl in hook.get_hookimpls()}
    tb = exc.__traceback__
    found = None
    while tb is not None:
        name = codes.get(tb.tb_frame.f_code)
        if name is not None:
            found = name
        tb = tb.tb_next
    if found is None:
        return "(unknown)"
    dist = manager.get_plugin_manager().distribution_of(found)
    return f"{found!r} (distribution {dist})" if dist else repr(found)


def _step_copy(config: EngineConfig, changes: ChangeLog) -> None:
    """Step 1: mirror the model's attention facts into the cache config."""
    changes.record(
        "cache.sliding_window",
        config.model.sliding_window,
        "mirrors model.sliding_window",
    )
    changes.record(
        "cache.is_attention_free",
        config.model.is_attention_free,
        "mirrors model.is_attention_free",
    )


def _step_defaults(config: EngineConfig, plat: Platform, changes: ChangeLog) -> None:
    """Step 2: compilation level, prefix caching, chunked prefill and model dtype."""
    from hwplug.core.config import CompilationLevel

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


def _step_graph_defaults(config: EngineConfig, plat: Platform, changes: ChangeLog) -> None:
    """Step 3: the graph-capture mode."""
    from hwplug.core.config import CompilationLevel, CUDAGraphMode

    comp = config.compilation
    mode = comp.cudagraph_mode
    device = plat.describe_device()
    if not plat.supports_device_graphs:
        if mode is None:
            changes.record(
                "compilation.cudagraph_mode",
                CUDAGraphMode.NONE,
                f"{plat.name} has no device graphs",
            )
        elif mode != CUDAGraphMode.NONE:
            raise ConfigError(
                f"compilation.cudagraph_mode={mode} is not supported on {device}: the "
                f"{plat.name} platform has no device graphs; use NONE"
            )
        return
    if mode is None:
        if config.model.enforce_eager:
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
        return
    if config.model.enforce_eager and mode != CUDAGraphMode.NONE:
        raise ConfigError(
            f"compilation.cudagraph_mode={mode} contradicts model.enforce_eager=True; "
            "set compilation.cudagraph_mode=NONE or model.enforce_eager=False"
        )
    if mode.requires_piecewise_compilation() and not plat.supports_piecewise_graphs:
        raise ConfigError(
            f"compilation.cudagraph_mode={mode} is not supported on {device}: {plat.name} "
            "graphs capture the whole forward pass only; use FULL or NONE"
        )


_PIECEWISE_SENSITIVE = ("compilation.cudagraph_mode", "compilation.splitting_ops")


def _step_finalise(config: EngineConfig, plat: Platform, changes: ChangeLog) -> None:
    """Step 5: splitting ops, capture sizes, warm-ups and the padding table."""
    from hwplug.core.config import CompilationLevel, CUDAGraphMode

    comp = config.compilation
    mode = comp.cudagraph_mode if comp.cudagraph_mode is not None else CUDAGraphMode.NONE
    if mode.requires_piecewise_compilation() and comp.level != CompilationLevel.PIECEWISE:
        raise ConfigError(
            f"compilation.cudagraph_mode={mode} needs piecewise compilation, but "
            f"compilation.level={comp.level}; set compilation.level=3 (PIECEWISE) or "
            "compilation.cudagraph_mode=FULL or NONE"
        )

    if comp.level == CompilationLevel.PIECEWISE:
        before = {p: copy.deepcopy(changes.get(p)) for p in _PIECEWISE_SENSITIVE}
        comp.set_splitting_ops_for_v1()
        for path in _PIECEWISE_SENSITIVE:
            after = changes.get(path)
            if _same(before[path], after):
                continue
            if changes.was_set(path):
                raise ConfigError(_splitting_conflict(path, before[path], after, comp))
            changes.note(path, before[path], copy.deepcopy(after), _splitting_reason(path, comp))

    mode = comp.cudagraph_mode if comp.cudagraph_mode is not None else CUDAGraphMode.NONE
    graphs_on = (
        plat.supports_device_graphs
        and mode != CUDAGraphMode.NONE
        and not config.model.enforce_eager
    )
    sizes_before = copy.deepcopy(comp.cudagraph_capture_sizes)
    compile_before = copy.deepcopy(comp.compile_sizes)
    sizes = config.default_cudagraph_capture_sizes() if graphs_on else []
    comp.init_with_cudagraph_sizes(sizes)
    if sizes_before is None:
        reason = (
            f"from scheduler.cuda_graph_sizes={config.scheduler.cuda_graph_sizes} "
            f"and max_num_batched_tokens={config.scheduler.max_num_batched_tokens}"
            if graphs_on
            else "graphs are off: nothing to capture"
        )
    else:
        reason = "user sizes deduplicated and sorted" + (
            "" if graphs_on else " (graphs are off: they will not be captured)"
        )
    changes.note(
        "compilation.cudagraph_capture_sizes",
        sizes_before,
        copy.deepcopy(comp.cudagraph_capture_sizes),
        reason,
    )
    if compile_before is not None or comp.compile_sizes:
        changes.note(
            "compilation.compile_sizes",
            compile_before,
            copy.deepcopy(comp.compile_sizes),
            "sizes for Inductor: 'cudagraph_capture_sizes' expanded, duplicates removed",
        )
    if graphs_on and comp.cudagraph_num_of_warmups == 0:
        changes.record(
            "compilation.cudagraph_num_of_warmups",
            1,
            "one eager warm-up run before each capture",
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
