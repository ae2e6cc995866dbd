"""Shared machinery of the config models: validation settings, errors, stable values.

Nothing here imports torch; the torch version is read from package metadata.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import enum
import functools
import importlib
import importlib.metadata
import logging
from collections.abc import Callable, Iterable, Mapping
from pathlib import PurePath
from typing import Annotated, Any, ClassVar, TypeVar

from pydantic import BeforeValidator, ConfigDict, Field, ValidationError

from hwplug.core.errors import ConfigError, brief

__all__ = [
    "CONFIG",
    "ConfigSection",
    "Count",
    "Fraction",
    "NonNegativeFloat",
    "MAX_BYTES",
    "MAX_DEPTH",
    "MAX_GIB",
    "MAX_SIZE",
    "PositiveInt",
    "Size",
    "check_depth",
    "config_section",
    "did_you_mean",
    "format_validation_error",
    "jsonable",
    "logger",
    "qualified_name",
    "resolve_qualname",
    "stable_factors",
    "surface",
    "torch_version",
    "torch_version_at_least",
]

logger = logging.getLogger("hwplug.config")

#: Validation settings shared by every config model: unknown keys are errors,
#: assignments are validated, infinities and NaNs are rejected, and attribute
#: docstrings become field descriptions in the JSON schema.
CONFIG = ConfigDict(
    extra="forbid",
    validate_assignment=True,
    arbitrary_types_allowed=True,
    allow_inf_nan=False,
    use_attribute_docstrings=True,
)


def _not_bool(value: Any) -> Any:
    # pydantic's lax mode reads True as 1; a boolean in a numeric field is a slip.
    if isinstance(value, bool):
        raise ValueError(f"expected a number, got the boolean {value}")
    return value


MAX_SIZE = 1 << 20
"""Largest batch, capture or scheduling size (tokens, sequences, a device count)."""
MAX_BYTES = 1 << 60
"""Largest memory figure in bytes (and the bound of any other integer setting)."""
MAX_GIB = float(1 << 30)
"""Largest memory figure in GiB (2**60 bytes)."""

#: An integer in [1, 2**60] (booleans rejected).
PositiveInt = Annotated[int, BeforeValidator(_not_bool), Field(ge=1, le=MAX_BYTES)]
#: An integer in [1, 2**20] (booleans rejected): batch, capture and scheduling sizes.
Size = Annotated[int, BeforeValidator(_not_bool), Field(ge=1, le=MAX_SIZE)]
#: An integer in [0, 2**60] (booleans rejected): block counts, byte sizes.
Count = Annotated[int, BeforeValidator(_not_bool), Field(ge=0, le=MAX_BYTES)]
#: A float in [0, 2**30] (booleans rejected): GiB amounts.
NonNegativeFloat = Annotated[float, BeforeValidator(_not_bool), Field(ge=0, le=MAX_GIB)]
#: A float in (0, 1] (booleans rejected): memory fractions.
Fraction = Annotated[float, BeforeValidator(_not_bool), Field(gt=0, le=1)]


# --------------------------------------------------------------------------- errors


def _config_errors(exc: ValidationError) -> list[ConfigError]:
    """The ``ConfigError``s our own validators raised, if they caused every error."""
    found: list[ConfigError] = []
    for error in exc.errors():
        cause = (error.get("ctx") or {}).get("error")
        if not isinstance(cause, ConfigError):
            return []
        found.append(cause)
    return found


def surface(exc: ValidationError) -> ValueError:
    """Turn a ``ValidationError`` made only of our ``ConfigError``s back into one.

    pydantic wraps every ``ValueError`` a validator raises; our checks already
    word their messages with the ``section.field`` path, so the user gets them
    as the ``ConfigError`` they are. Type and range errors stay pydantic's.
    """
    causes = _config_errors(exc)
    if not causes:
        return exc
    if len(causes) == 1:
        return causes[0]
    return ConfigError("; ".join(str(cause) for cause in causes))


def format_validation_error(exc: ValidationError, prefix: str) -> str:
    """One line per error, each starting with its ``prefix.field`` path."""
    lines = []
    for error in exc.errors():
        cause = (error.get("ctx") or {}).get("error")
        path = prefix + "".join(_loc_part(part) for part in error["loc"])
        if isinstance(cause, ConfigError):
            # Our own messages already carry the path.
            lines.append(str(cause))
        else:
            lines.append(f"{path}: {error['msg']} (got {brief(error.get('input'))})")
    return "; ".join(dict.fromkeys(lines))


def _loc_part(part: object) -> str:
    """One step of a pydantic error location as a path suffix (``.field``, ``[0]``).

    pydantic also names the union member or validator it tried
    (``function-after[...]``, ``int``); those are not part of the user's path.
    """
    if isinstance(part, int):
        return f"[{part}]"
    text = str(part)
    if not text.isidentifier() or text in ("int", "str", "float", "bool", "list", "dict"):
        return ""
    return f".{text}"


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` when ``name`` looks like a typo of one of ``choices``."""
    close = difflib.get_close_matches(name, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


_S = TypeVar("_S", bound="ConfigSection")
_T = TypeVar("_T", bound=type)


class ConfigSection:
    """Behaviour shared by every config model (mixed into the pydantic dataclasses).

    ``section`` is the key of the model in ``EngineConfig`` (``"cache"``); it
    prefixes field names in error messages (``cache.block_size``).

    Every instance remembers which fields the user gave: constructor
    arguments, keys of the dict or file it was built from, and later
    assignments, whatever their values. Values a model fills in itself while
    it is built (``SchedulerConfig.cuda_graph_sizes``, migrated deprecated
    flags) are not the user's.
    """

    section: ClassVar[str] = ""

    @classmethod
    def init_field_names(cls) -> tuple[str, ...]:
        """Names of the fields a user may set (constructor arguments)."""
        return tuple(f.name for f in dataclasses.fields(cls) if f.init)  # type: ignore[arg-type]

    def given_fields(self) -> frozenset[str]:
        """Names of the fields the user gave (as arguments, dict keys or assignments).

        A field given the value ``None`` or ``"auto"``, which mean "decide for
        me", is still listed here; :func:`hwplug.core.resolve.user_set_fields`
        leaves those out.
        """
        given: frozenset[str] = self.__dict__.get(_GIVEN, frozenset())
        return given

    def copy(self: _S) -> _S:
        """An independent deep copy (the given fields included)."""
        return copy.deepcopy(self)

    def to_dict(self) -> dict[str, Any]:
        """The user-settable fields as a JSON-ready dict (derived fields left out)."""
        return {name: jsonable(getattr(self, name)) for name in self.init_field_names()}


# Instance attributes (outside the dataclass fields) of every config section.
_GIVEN = "_hwplug_given"
_BUILDING = "_hwplug_building"


def _unknown_field(cls: type[ConfigSection], name: str) -> ConfigError:
    allowed = cls.init_field_names()
    attr = getattr(cls, name, None)
    if isinstance(attr, property):
        return ConfigError(
            f"{cls.section}.{name} is derived and read-only; settable fields: {', '.join(allowed)}"
        )
    return ConfigError(
        f"{cls.section}.{name}: unknown field{did_you_mean(name, allowed)}; "
        f"allowed fields: {', '.join(allowed)}"
    )


def config_section(cls: _T) -> _T:
    """Finish a pydantic config dataclass: friendly errors on init and assignment.

    - an unknown keyword argument or attribute is a ``ConfigError`` that names
      ``section.field`` and lists the allowed fields;
    - an error that only our own checks raised surfaces as that ``ConfigError``
      instead of pydantic's wrapper;
    - a rejected assignment leaves the object as it was (pydantic would keep
      the new value when a whole-object check fails);
    - the fields the user gives are remembered (see :meth:`ConfigSection.given_fields`).
    """
    init: Callable[..., None] = vars(cls)["__init__"]
    setattr_: Callable[[Any, str, Any], None] = vars(cls).get("__setattr__", object.__setattr__)
    ordered_names: tuple[str, ...] = cls.init_field_names()  # type: ignore[attr-defined]
    names = frozenset(ordered_names)
    all_fields = frozenset(f.name for f in dataclasses.fields(cls))

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        for key in kwargs:
            if key not in names:
                raise _unknown_field(cls, key)
        given = frozenset(kwargs) | frozenset(ordered_names[: len(args)])
        object.__setattr__(self, _BUILDING, True)
        try:
            init(self, *args, **kwargs)
        except ValidationError as exc:
            raise surface(exc) from None
        finally:
            object.__setattr__(self, _BUILDING, False)
        object.__setattr__(self, _GIVEN, given)

    @functools.wraps(setattr_)
    def __setattr__(self: Any, name: str, value: Any) -> None:
        if name.startswith("_"):
            object.__setattr__(self, name, value)
            return
        if name not in all_fields:
            raise _unknown_field(cls, name)
        missing = object()
        old = self.__dict__.get(name, missing)
        # pydantic's assignment validation may rebuild __dict__ from the fields alone.
        building = self.__dict__.get(_BUILDING, False)
        given = self.given_fields()
        try:
            setattr_(self, name, value)
        except ValidationError as exc:
            if old is missing:
                self.__dict__.pop(name, None)
            else:
                self.__dict__[name] = old
            raise surface(exc) from None
        finally:
            object.__setattr__(self, _BUILDING, building)
            object.__setattr__(self, _GIVEN, given)
        if name in names and not building:
            object.__setattr__(self, _GIVEN, given | {name})

    cls.__init__ = __init__  # type: ignore[misc]
    cls.__setattr__ = __setattr__  # type: ignore[assignment]
    return cls


# --------------------------------------------------------------------------- nesting

MAX_DEPTH = 32
"""How deeply dicts and lists may nest in a config."""

MAX_VALUES = 1 << 16
"""How many values (dicts, lists and scalars, counted as written out) a config may hold.
YAML aliases share one object between many places: a file of a few hundred bytes can
stand for billions of values, which every later step would walk."""


def check_depth(
    data: Any, where: str = "", limit: int = MAX_DEPTH, max_values: int = MAX_VALUES
) -> None:
    """Refuse values nested deeper than ``limit`` (dicts and lists), naming the path,
    and data holding more than ``max_values`` values counted as written out (a shared
    object counts once per place it appears, so YAML alias bombs are refused at once).

    :raises ConfigError: the path of the first value found too deep, or too many values.
    """
    stack: list[tuple[Any, str, int]] = [(data, where, 0)]
    seen = 0
    while stack:
        value, path, depth = stack.pop()
        seen += 1
        if seen > max_values:
            raise ConfigError(
                f"{(where or 'the config')[:120]}: holds more than {max_values} values (YAML "
                "aliases count once per place they are used); an engine config holds "
                "sections of fields, with small lists and dicts"
            )
        if isinstance(value, Mapping):
            children: list[tuple[Any, str]] = [
                (v, f"{path}.{k}" if path else str(k)) for k, v in value.items()
            ]
        elif isinstance(value, list | tuple):
            children = [(v, f"{path}[{i}]") for i, v in enumerate(value)]
        else:
            continue
        if depth >= limit:
            raise ConfigError(
                f"{path[:120]}: values are nested more than {limit} levels deep; an engine config "
                "holds sections of fields, with small lists and dicts"
            )
        stack.extend((child, child_path, depth + 1) for child, child_path in children)


# --------------------------------------------------------------------------- names


def qualified_name(obj: Any) -> str:
    """``module.qualname`` of a function or class; of its type for other objects.

    Objects may name themselves through a ``qualified_name`` attribute (the
    inductor-pass wrapper does, to stand for the callable it wraps).
    """
    own = getattr(obj, "qualified_name", None)
    if isinstance(own, str):
        return own
    target = obj if hasattr(obj, "__qualname__") else type(obj)
    module = getattr(target, "__module__", None) or ""
    qualname = getattr(target, "__qualname__", None) or repr(target)
    return f"{module}.{qualname}" if module else qualname


def resolve_qualname(name: str) -> Any:
    """Import the object a dotted name such as ``"os.path.join"`` refers to.

    The longest importable module prefix is imported and the rest is looked up
    as attributes, so nested names (``"pkg.mod.Class.method"``) work.

    :raises ImportError: nothing importable is called ``name``.
    """
    parts = name.split(".")
    if not name or not all(part.isidentifier() for part in parts):
        raise ImportError(f"{name!r} is not a dotted Python name")
    for split in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:split])
        try:
            obj: Any = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            # Only a missing *prefix* means "try a shorter module name".
            if exc.name is not None and not module_name.startswith(exc.name):
                raise
            continue
        try:
            for attr in parts[split:]:
                obj = getattr(obj, attr)
        except AttributeError:
            raise ImportError(
                f"module {module_name!r} has no attribute {'.'.join(parts[split:])!r}"
            ) from None
        return obj
    raise ImportError(f"no module found for {name!r}")


# --------------------------------------------------------------------------- values


def jsonable(value: Any) -> Any:
    """``value`` as plain JSON data: enums by name, paths as strings, callables by
    qualified name, config dataclasses as dicts of their settable fields."""
    if value is None or isinstance(value, (bool, int, float, str)):
        if isinstance(value, enum.Enum):
            return value.name
        return value
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, ConfigSection):
        return value.to_dict()
    if isinstance(value, dict):
        return {str(key): jsonable(item) for key, item in value.items()}
    if isinstance(value, (set, frozenset)):
        return sorted((jsonable(item) for item in value), key=repr)
    if isinstance(value, (list, tuple)):
        return [jsonable(item) for item in value]
    if callable(value):
        return qualified_name(value)
    return str(value)


def stable_factors(value: Any) -> Any:
    """``value`` with everything whose ``str()`` varies between processes replaced.

    Callables become their qualified names, sets become sorted lists, and
    objects printed with a memory address become their type's qualified name.
    Plain data keeps its type, so its ``str()`` is unchanged.
    """
    if value is None or isinstance(value, (bool, int, float, str, enum.Enum, PurePath)):
        return value
    if isinstance(value, dict):
        return {key: stable_factors(item) for key, item in value.items()}
    if isinstance(value, list):
        return [stable_factors(item) for item in value]
    if isinstance(value, tuple):
        return tuple(stable_factors(item) for item in value)
    if isinstance(value, (set, frozenset)):
        return sorted((stable_factors(item) for item in value), key=repr)
    if callable(value):
        return qualified_name(value)
    if type(value).__repr__ is object.__repr__:
        return qualified_name(value)
    return value


# The installed torch release, read without importing torch (re-exported here).
from hwplug.core.versions import torch_version, torch_version_at_least  # noqa: E402
