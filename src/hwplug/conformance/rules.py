"""Rule checks: the platform's tables, detection and resolution keep hwplug's contract."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from typing import TYPE_CHECKING, Any

from hwplug.attention import available_backends, backends_for
from hwplug.conformance.base import (
    CheckContext,
    CheckFailed,
    CheckSkipped,
    ResolutionBlocked,
    check,
)
from hwplug.conformance.configs import for_each_config
from hwplug.core.config import EngineConfig
from hwplug.core.errors import ConfigError, PluginError, error_line
from hwplug.core.graphs import GraphWrapper
from hwplug.core.kv_cache import cache_dtype_to_torch
from hwplug.core.platform import DeviceInfo, Platform
from hwplug.core.resolve import user_set_fields

if TYPE_CHECKING:
    from hwplug.core.resolve import Resolution

__all__: list[str] = []

_SUBPROCESS_TIMEOUT = 120


# --------------------------------------------------------------------------- helpers


def _config(data: dict[str, Any]) -> EngineConfig | None:
    """The config of ``data``, or None when the config models refuse it."""
    try:
        return EngineConfig.from_dict(copy.deepcopy(data))
    except ValueError:
        return None


def _outcome(platform: Platform, context: CheckContext, config: EngineConfig) -> Any:
    """The resolution, or the ``ConfigError`` refusing ``config``."""
    try:
        return context.resolve(platform, config)
    except ConfigError as exc:
        return exc


def _strict(
    platform: Platform, context: CheckContext, data: dict[str, Any]
) -> tuple[EngineConfig, Resolution | ConfigError] | None:
    """``data``'s config and its resolution (or refusal); None when the config models
    refuse ``data``. A :class:`PluginError` fails the check."""
    config = _config(data)
    if config is None:
        return None
    try:
        return config, _outcome(platform, context, config)
    except PluginError as exc:
        raise CheckFailed(f"resolution raised PluginError: {error_line(exc)}") from exc


class _Tally:
    """Counts generated configs that resolved, and collects plugin errors seen (R06 and
    R07 report them; the checks that tally them only note them)."""

    def __init__(self) -> None:
        self.resolved = 0
        self.plugin_errors: list[str] = []

    def outcome(self, platform: Platform, context: CheckContext, config: EngineConfig) -> Any:
        """The resolution, the ``ConfigError`` refusing ``config``, or None after a
        :class:`PluginError` (collected)."""
        try:
            return _outcome(platform, context, config)
        except PluginError as exc:
            self.plugin_errors.append(error_line(exc))
            return None

    def resolution(
        self, platform: Platform, context: CheckContext, data: dict[str, Any]
    ) -> tuple[EngineConfig, Resolution] | None:
        """``data``'s config and its resolution, counted; None when it was refused (by
        the config models or resolution) or a plugin raised."""
        config = _config(data)
        if config is None:
            return None
        result = self.outcome(platform, context, config)
        if result is None or isinstance(result, ConfigError):
            return None
        self.resolved += 1
        return config, result

    def finish(self, context: CheckContext, what: str) -> None:
        if self.plugin_errors:
            context.note(
                f"{len(self.plugin_errors)} generated config(s) raised PluginError "
                f"(reported by R06 and R07): {self.plugin_errors[0]}"
            )
        if not self.resolved:
            raise CheckSkipped(f"no generated config resolved, so {what} could not be checked")


def _blocked(function: Any) -> Any:
    """Turn :class:`ResolutionBlocked` into a skip with its reason."""

    def run(platform: Platform, context: CheckContext) -> None:
        try:
            function(platform, context)
        except ResolutionBlocked as exc:
            raise CheckSkipped(str(exc)) from None

    run.__name__ = function.__name__
    run.__doc__ = function.__doc__
    return run


def _paths(data: dict[str, Any]) -> dict[str, Any]:
    return {
        f"{section}.{name}": value
        for section, fields in data.items()
        if isinstance(fields, dict)
        for name, value in fields.items()
    }


def _same_value(old: Any, new: Any) -> bool:
    """Equal, or an unset ``None`` filled with an empty list or dict (a normal form)."""
    if old is None and isinstance(new, list | dict) and not new:
        return True
    return bool(old == new)


def _text(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _import_path(cls: type) -> tuple[str, str] | None:
    """``(module, qualname)`` when ``cls`` can be imported by name in another process."""
    module, qualname = cls.__module__, cls.__qualname__
    if "<locals>" in qualname or module == "__main__":
        return None
    return module, qualname


def _child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env.update(extra)
    return env


def _run_child(code: str, *, stdin: str = "", **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        input=stdin,
        capture_output=True,
        text=True,
        env=_child_env(**env),
        timeout=_SUBPROCESS_TIMEOUT,
        check=False,
    )


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


# --------------------------------------------------------------------------- checks


@check(
    "R01",
    "Profiles are valid",
    protects="a test matrix or simulated run that cannot build the platform from a profile.",
    kind="rule",
)
def profiles_are_valid(platform: Platform, context: CheckContext) -> None:
    """Every profile is a lower-case name of a DeviceInfo with memory, and simulates."""
    cls = type(platform)
    try:
        profiles = cls.profiles()
    except Exception as exc:
        raise CheckFailed(f"{cls.__name__}.profiles() raised {error_line(exc)}") from exc
    if not isinstance(profiles, dict):
        raise CheckFailed(f"profiles() returned {type(profiles).__name__}, not a dict")
    if not profiles:
        raise CheckSkipped("the platform has no simulated profiles")
    problems = []
    for name, device in profiles.items():
        if not isinstance(name, str) or not name or name != name.strip().lower() or ":" in name:
            problems.append(f"profile name {name!r} is not a lower-case name without ':'")
            continue
        if not isinstance(device, DeviceInfo):
            problems.append(f"profile {name!r} is a {type(device).__name__}, not a DeviceInfo")
            continue
        if device.total_memory <= 0:
            problems.append(f"profile {name!r} reports total_memory={device.total_memory}")
        try:
            simulated = cls.simulate(name)
        except Exception as exc:
            problems.append(f"simulate({name!r}) raised {error_line(exc)}")
            continue
        if not (isinstance(simulated, cls) and simulated.simulated and simulated.devices):
            problems.append(f"simulate({name!r}) did not return a simulated {cls.__name__}")
    rep = cls.representative_profile
    if rep is not None and rep not in profiles:
        problems.append(f"representative_profile={rep!r} is not one of the profiles")
    if problems:
        raise CheckFailed("; ".join(problems))


_DETECT_CODE = """
import importlib, json, sys
module, qualname = sys.argv[1], sys.argv[2]
cls = importlib.import_module(module)
for part in qualname.split("."):
    cls = getattr(cls, part)
before = "torch" in sys.modules
try:
    devices = cls.detect()
except BaseException as exc:
    print(json.dumps({"raised": f"{type(exc).__name__}: {exc}"}))
    raise SystemExit(0)
print(json.dumps({"torch_before": before, "torch": "torch" in sys.modules,
                  "devices": isinstance(devices, list)}))
"""


@check(
    "R02",
    "detect() imports no torch and never raises",
    protects="a process that pays for importing torch, or fails to start, on every import.",
    kind="rule",
)
def detect_is_cheap(platform: Platform, context: CheckContext) -> None:
    """Run ``detect()`` in a fresh process: no exception, a list, torch not imported."""
    cls = type(platform)
    where = _import_path(cls)
    if where is None:
        _detect_here(cls)
        return
    code = _DETECT_CODE.replace("sys.argv[1], sys.argv[2]", f"{where[0]!r}, {where[1]!r}")
    result = _run_child(code)
    line = _last_line(result.stdout)
    if result.returncode != 0 or not line.startswith("{"):
        raise CheckFailed(
            f"importing {where[0]} and calling detect() in a fresh process failed: "
            f"{_last_line(result.stderr) or 'no output'}"
        )
    out = json.loads(line)
    if "raised" in out:
        raise CheckFailed(f"{cls.__name__}.detect() raised {out['raised']}; return [] instead")
    if out["torch_before"]:
        raise CheckFailed(f"importing {where[0]} imports torch; import it lazily")
    if out["torch"]:
        raise CheckFailed(f"{cls.__name__}.detect() imported torch; probe without it")
    if not out["devices"]:
        raise CheckFailed(f"{cls.__name__}.detect() did not return a list of DeviceInfo")


def _detect_here(cls: type[Platform]) -> None:
    """In-process fallback for a class no other process can import: watch imports."""
    import builtins

    seen: list[str] = []
    original = builtins.__import__

    def watching(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "torch" or name.startswith("torch."):
            seen.append(name)
        return original(name, *args, **kwargs)

    builtins.__import__ = watching
    try:
        devices = cls.detect()
    except Exception as exc:
        raise CheckFailed(
            f"{cls.__name__}.detect() raised {error_line(exc)}; return [] instead"
        ) from exc
    finally:
        builtins.__import__ = original
    if seen:
        raise CheckFailed(f"{cls.__name__}.detect() imported {seen[0]}; probe without torch")
    if not isinstance(devices, list):
        raise CheckFailed(f"{cls.__name__}.detect() did not return a list of DeviceInfo")


@check(
    "R03",
    "Resolution is deterministic",
    protects="ranks of one engine that resolve the same config differently.",
    kind="rule",
)
@_blocked
def deterministic(platform: Platform, context: CheckContext) -> None:
    """The same input twice gives the same config, hash and changes (or the same refusal)."""
    tally = _Tally()

    def test(data: dict[str, Any]) -> None:
        config = _config(data)
        if config is None:
            return
        first = tally.outcome(platform, context, config)
        second = tally.outcome(platform, context, config) if first is not None else None
        if first is None or second is None:
            return
        if isinstance(first, ConfigError) or isinstance(second, ConfigError):
            if str(first) != str(second):
                raise CheckFailed(f"resolving twice gave {first!s:.200} and then {second!s:.200}")
            return
        tally.resolved += 1
        if first.to_dict() != second.to_dict():
            raise CheckFailed("resolving the same config twice gave different results")
        if first.config.compute_hash() != second.config.compute_hash():
            raise CheckFailed("resolving the same config twice gave different compute_hash()")

    for_each_config(platform, context, test)
    tally.finish(context, "determinism")


@check(
    "R04",
    "Resolution is idempotent",
    protects="an engine that re-resolves a saved config and silently gets another one.",
    kind="rule",
)
@_blocked
def idempotent(platform: Platform, context: CheckContext) -> None:
    """Resolving ``from_dict(resolved.to_dict())`` records no change and keeps the hash."""
    tally = _Tally()

    def test(data: dict[str, Any]) -> None:
        found = tally.resolution(platform, context, data)
        if found is None:
            return
        resolved = found[1].config
        again = tally.outcome(platform, context, EngineConfig.from_dict(resolved.to_dict()))
        if again is None:
            return
        if isinstance(again, ConfigError):
            raise CheckFailed(f"the resolved config does not resolve again: {error_line(again)}")
        if again.changes:
            raise CheckFailed(f"resolving a resolved config changed it again: {again.changes[0]}")
        if again.config.compute_hash() != resolved.compute_hash():
            raise CheckFailed("resolving a resolved config changed compute_hash()")

    for_each_config(platform, context, test)
    tally.finish(context, "idempotence")


@check(
    "R05",
    "Verification changes nothing",
    protects="a config that drifts while being checked, after its changes were reported.",
    kind="rule",
)
@_blocked
def verify_changes_nothing(platform: Platform, context: CheckContext) -> None:
    """``verify_config`` and every ``hwplug_verify_config`` hook accept a resolved config
    and leave it as it was."""
    tally = _Tally()
    hook = context.the_session().hooks

    def test(data: dict[str, Any]) -> None:
        found = tally.resolution(platform, context, data)
        if found is None:
            return
        work = copy.deepcopy(found[1].config)
        before = work.to_dict()
        try:
            platform.verify_config(work)
            hook.hwplug_verify_config(config=work, platform=platform)
        except ConfigError as exc:
            raise CheckFailed(f"verification refused a resolved config: {error_line(exc)}") from exc
        after = work.to_dict()
        changed = [p for p, v in _paths(before).items() if _paths(after).get(p) != v]
        if changed:
            raise CheckFailed(f"verification changed {', '.join(changed)}")

    for_each_config(platform, context, test)
    tally.finish(context, "verification")


@check(
    "R06",
    "Explicit choices are never replaced",
    protects="an engine running something other than what the user asked for, unannounced.",
    kind="rule",
)
@_blocked
def honours_user_fields(platform: Platform, context: CheckContext) -> None:
    """No change touches a field the user set, and every set field keeps its value."""
    refused = 0

    def test(data: dict[str, Any]) -> None:
        nonlocal refused
        found = _strict(platform, context, data)
        if found is None:
            return
        config, result = found
        if isinstance(result, ConfigError):
            refused += 1
            return
        user = user_set_fields(config)
        for change in result.changes:
            if change.path in user and not isinstance(change.old, dict):
                raise CheckFailed(f"{change.source} changed {change.path}, which the user set")
        given, got = _paths(config.to_dict()), _paths(result.config.to_dict())
        for path in sorted(user):
            if path in given and not isinstance(given[path], dict) and given[path] != got[path]:
                raise CheckFailed(
                    f"{path}: the user set {_text(given[path])}, resolution gave {_text(got[path])}"
                )

    for_each_config(platform, context, test)


@check(
    "R07",
    "Every change is logged with a source and a reason",
    protects="a resolved config whose differences from the input nobody can explain.",
    kind="rule",
)
@_blocked
def changes_are_logged(platform: Platform, context: CheckContext) -> None:
    """Every field that differs from the input is in the change log, with a source and a
    non-empty reason, and its last change gives the resolved value."""

    def test(data: dict[str, Any]) -> None:
        found = _strict(platform, context, data)
        if found is None:
            return
        config, result = found
        if isinstance(result, ConfigError):
            return
        before, after = _paths(config.to_dict()), _paths(result.config.to_dict())
        last = {c.path: c for c in result.changes}
        for change in result.changes:
            if not change.source or not change.reason.strip():
                raise CheckFailed(f"change to {change.path} has no source or no reason")
        for path, value in after.items():
            if _same_value(before.get(path), value):
                continue
            if path not in last:
                raise CheckFailed(
                    f"{path} went from {_text(before.get(path))} to {_text(value)} "
                    "with no change logged"
                )

    for_each_config(platform, context, test)


_HASH_CODE = """
import json, sys
from hwplug.core.config import EngineConfig
print(json.dumps([EngineConfig.from_dict(d).compute_hash() for d in json.load(sys.stdin)]))
"""


@check(
    "R08",
    "Config hashes are stable across processes",
    protects="compilation caches and ranks that disagree because a hash depends on the process.",
    kind="rule",
)
@_blocked
def hashes_are_stable(platform: Platform, context: CheckContext) -> None:
    """``compute_hash()`` of resolved configs is the same in a process with another
    ``PYTHONHASHSEED``."""
    tally = _Tally()
    configs: list[dict[str, Any]] = []
    hashes: list[str] = []

    def test(data: dict[str, Any]) -> None:
        found = tally.resolution(platform, context, data)
        if found is None:
            return
        resolved = found[1].config.to_dict()
        configs.append(resolved)
        hashes.append(EngineConfig.from_dict(resolved).compute_hash())

    for_each_config(platform, context, test)
    tally.finish(context, "hash stability")
    seed = "1" if os.environ.get("PYTHONHASHSEED") != "1" else "2"
    result = _run_child(_HASH_CODE, stdin=json.dumps(configs), PYTHONHASHSEED=seed)
    if result.returncode != 0:
        raise CheckFailed(f"hashing in another process failed: {_last_line(result.stderr)}")
    other = json.loads(_last_line(result.stdout))
    for data, here, there in zip(configs, hashes, other, strict=True):
        if here != there:
            raise CheckFailed(
                f"compute_hash() is {here} here and {there} with PYTHONHASHSEED={seed} "
                f"(config: {_text(_paths(data))[:300]})"
            )


def _resolve_fields(
    platform: Platform, context: CheckContext, fields: dict[str, Any]
) -> Resolution | ConfigError:
    data: dict[str, Any] = {}
    for path, value in fields.items():
        section, _, name = path.partition(".")
        data.setdefault(section, {})[name] = value
    return _outcome(platform, context, EngineConfig.from_dict(data))


@check(
    "R09",
    "Advertised block sizes resolve, others are refused",
    protects="an engine that picks a block size from supported_block_sizes() and is refused.",
    kind="rule",
)
@_blocked
def block_sizes_agree(platform: Platform, context: CheckContext) -> None:
    """Each advertised block size resolves when set explicitly and is kept; a block size
    not advertised is refused with a ConfigError naming ``cache.block_size``."""
    advertised = tuple(platform.supported_block_sizes())
    if not advertised:
        raise CheckFailed("supported_block_sizes() is empty")
    problems = []
    for size in advertised:
        result = _resolve_fields(platform, context, {"cache.block_size": size})
        if isinstance(result, ConfigError):
            problems.append(f"advertised cache.block_size={size} is refused: {error_line(result)}")
        elif result.config.cache.block_size != size:
            problems.append(f"cache.block_size={size} resolved to {result.config.cache.block_size}")
    try:
        chosen = platform.default_block_size(EngineConfig())
    except Exception as exc:
        problems.append(f"default_block_size() raised {error_line(exc)}")
    else:
        if chosen not in advertised:
            problems.append(
                f"the platform's default block size {chosen} (default_block_size()) is not one "
                f"it advertises ({', '.join(map(str, advertised))}): a config that leaves "
                "cache.block_size unset is refused; make the default one of them"
            )
    default = _resolve_fields(platform, context, {})
    if not isinstance(default, ConfigError) and default.config.cache.block_size not in advertised:
        problems.append(
            f"the default block size {default.config.cache.block_size} is not advertised "
            f"({', '.join(map(str, advertised))})"
        )
    other = next(n for n in (3, 5, 7, 11, 13, 24, 48, 96) if n not in advertised)
    result = _resolve_fields(platform, context, {"cache.block_size": other})
    if not isinstance(result, ConfigError):
        problems.append(f"unadvertised cache.block_size={other} resolved instead of being refused")
    elif "cache.block_size" not in str(result):
        problems.append(
            f"refusing cache.block_size={other}, the message does not name cache.block_size: "
            f"{error_line(result)}"
        )
    if problems:
        raise CheckFailed("; ".join(problems))


@check(
    "R10",
    "Advertised cache dtypes resolve",
    protects="an engine that allocates a KV cache in a dtype the platform then refuses.",
    kind="rule",
)
@_blocked
def cache_dtypes_agree(platform: Platform, context: CheckContext) -> None:
    """Each dtype of ``supported_cache_dtypes()`` resolves when set, is kept, and maps to a
    torch dtype (``cache_dtype_to_torch``)."""
    advertised = tuple(platform.supported_cache_dtypes())
    if not advertised:
        raise CheckFailed("supported_cache_dtypes() is empty")
    problems = []
    for name in advertised:
        result = _resolve_fields(platform, context, {"cache.cache_dtype": name})
        if isinstance(result, ConfigError):
            problems.append(
                f"advertised cache.cache_dtype={name!r} is refused: {error_line(result)}"
            )
            continue
        if result.config.cache.cache_dtype != name:
            problems.append(
                f"cache.cache_dtype={name!r} resolved to {result.config.cache.cache_dtype!r}"
            )
        try:
            cache_dtype_to_torch(name, result.config.model.dtype, platform)
        except Exception as exc:
            problems.append(f"cache.cache_dtype={name!r} maps to no torch dtype: {error_line(exc)}")
    if problems:
        raise CheckFailed("; ".join(problems))


@check(
    "R11",
    "fp8 names one float8 dtype",
    protects="an fp8 KV cache written in one float8 format and read in another.",
    kind="rule",
)
def fp8_dtype_agrees(platform: Platform, context: CheckContext) -> None:
    """``fp8_dtype()`` is the torch float8 dtype ``fp8_dtype_name`` names, and an
    advertised ``fp8`` cache stores exactly it."""
    import torch

    # lazy: torch loads only for the checks that need it
    from hwplug.kernels import FP8_FORMATS

    try:
        dtype = platform.fp8_dtype()
    except Exception as exc:
        raise CheckFailed(
            f"fp8_dtype() failed for fp8_dtype_name={platform.fp8_dtype_name!r}: {error_line(exc)}"
        ) from exc
    if dtype not in FP8_FORMATS:
        raise CheckFailed(f"fp8_dtype() is {dtype}, not a float8 format hwplug's kernels store")
    if str(dtype).removeprefix("torch.") != platform.fp8_dtype_name:
        raise CheckFailed(
            f"fp8_dtype() is {dtype}, but fp8_dtype_name is {platform.fp8_dtype_name!r}"
        )
    if platform.is_fp8_fnuz() != str(dtype).endswith("fnuz"):
        raise CheckFailed(f"is_fp8_fnuz() is {platform.is_fp8_fnuz()} for {dtype}")
    if "fp8" in platform.supported_cache_dtypes():
        stored = cache_dtype_to_torch("fp8", "bfloat16", platform)
        if stored != dtype:
            raise CheckFailed(
                f"cache.cache_dtype='fp8' stores {stored}, but fp8_dtype() is {dtype}"
            )
    del torch


@check(
    "R12",
    "The graph wrapper matches has_device_graphs()",
    protects="an engine that captures graphs with a wrapper that is not one, or never captures.",
    kind="rule",
)
def graph_wrapper_agrees(platform: Platform, context: CheckContext) -> None:
    """``has_device_graphs()`` answers, and is true exactly when ``graph_wrapper_cls()``
    returns a ``GraphWrapper`` subclass on a platform that supports device graphs."""
    try:
        wrapper = platform.graph_wrapper_cls()
    except Exception as exc:
        raise CheckFailed(f"graph_wrapper_cls() raised {error_line(exc)}") from exc
    if wrapper is not None and not (
        isinstance(wrapper, type) and issubclass(wrapper, GraphWrapper)
    ):
        raise CheckFailed(
            f"graph_wrapper_cls() returned {wrapper!r:.80}, not a subclass of "
            "hwplug.core.graphs.GraphWrapper"
        )
    try:
        has = platform.has_device_graphs()
    except Exception as exc:
        raise CheckFailed(f"has_device_graphs() raised {error_line(exc)}") from exc
    expected = platform.supports_device_graphs and wrapper is not None
    if has != expected:
        raise CheckFailed(
            f"has_device_graphs() is {has}, but supports_device_graphs is "
            f"{platform.supports_device_graphs} and graph_wrapper_cls() is {wrapper!r}"
        )
    if not has:
        return
    try:
        resolved = context.resolve(platform, _empty())
    except ResolutionBlocked as exc:
        raise CheckFailed(str(exc)) from None
    except (ConfigError, PluginError) as exc:
        raise CheckFailed(f"the default config does not resolve: {error_line(exc)}") from exc
    del resolved


def _empty() -> EngineConfig:
    return EngineConfig()


@check(
    "R13",
    "The attention order names installed backends",
    protects="an engine told to run an attention backend that does not exist.",
    kind="rule",
)
@_blocked
def attention_order_agrees(platform: Platform, context: CheckContext) -> None:
    """``attention_backends(config)`` names only installed backends that serve the
    platform (a backend's ``platforms``; another vendor's backend is not one), and
    resolution picks the first of them that serves the config."""
    session = context.the_session()
    installed = available_backends(session)
    eligible = backends_for(platform, session)
    problems: list[str] = []
    checked = 0

    def test(data: dict[str, Any]) -> None:
        nonlocal checked
        config = _config(data)
        if config is None:
            return
        if "attention" in data:
            return
        # a plugin's PluginError is R06's and R07's to report
        result = _Tally().outcome(platform, context, config)
        if result is None or isinstance(result, ConfigError):
            return
        checked += 1
        order = tuple(platform.attention_backends(result.config))
        unknown = [name for name in order if name not in installed]
        if unknown:
            raise CheckFailed(
                f"attention_backends() names {', '.join(map(repr, unknown))}, which no installed "
                f"plugin provides (installed: {', '.join(sorted(installed))})"
            )
        foreign = [name for name in order if name not in eligible]
        if foreign:
            raise CheckFailed(
                f"attention_backends() names {', '.join(map(repr, foreign))}, which do not serve "
                f"platform {platform.name!r} (their platforms leave it out); backends for it: "
                f"{', '.join(sorted(eligible))}"
            )
        chosen = result.config.attention.backend
        if chosen is not None and chosen not in order:
            raise CheckFailed(f"resolution chose attention backend {chosen!r}, not in {order}")

    for_each_config(platform, context, test)
    if problems:
        raise CheckFailed("; ".join(problems))
    if not checked:
        raise CheckSkipped("no generated config resolved")
