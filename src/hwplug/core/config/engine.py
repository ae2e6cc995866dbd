"""The engine config: every section together, with loading, saving and hashing."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError
from pydantic.dataclasses import dataclass

from hwplug.core.config._common import (
    CONFIG,
    MAX_DEPTH,
    ConfigSection,
    check_depth,
    config_section,
    did_you_mean,
    format_validation_error,
)
from hwplug.core.config.attention import AttentionConfig
from hwplug.core.config.cache import CacheConfig
from hwplug.core.config.compilation import CompilationConfig
from hwplug.core.config.model import ModelConfig
from hwplug.core.config.parallel import ParallelConfig
from hwplug.core.config.scheduler import SchedulerConfig
from hwplug.core.errors import ConfigError

__all__ = ["EngineConfig"]

# Sizes below 8 that a single capture-size bound expands to.
_SMALL_CAPTURE_SIZES = (1, 2, 4)
_CAPTURE_SIZE_STEP = 8
_SUPPORTED_SUFFIXES = (".json", ".yaml", ".yml", ".toml")
MAX_FILE_BYTES = 1 << 20
"""The largest config file read (1 MiB)."""


@config_section
@dataclass(config=CONFIG)
class EngineConfig(ConfigSection):
    """Everything an engine asks of the platform, one section per concern.

    Build it in code, from a dict (``from_dict``) or from a JSON, YAML or TOML
    file (``from_file``); sections and fields left out keep their defaults.
    """

    section = "engine"

    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    """The model's shape and dtype."""
    cache: CacheConfig = dataclasses.field(default_factory=CacheConfig)
    """The KV cache."""
    compilation: CompilationConfig = dataclasses.field(default_factory=CompilationConfig)
    """Compilation and graph capture."""
    parallel: ParallelConfig = dataclasses.field(default_factory=ParallelConfig)
    """Tensor, pipeline and data parallelism."""
    scheduler: SchedulerConfig = dataclasses.field(default_factory=SchedulerConfig)
    """Batch limits."""
    attention: AttentionConfig = dataclasses.field(default_factory=AttentionConfig)
    """The attention backend."""

    @classmethod
    def section_types(cls) -> dict[str, type[ConfigSection]]:
        """Section name -> config class."""
        return {
            "model": ModelConfig,
            "cache": CacheConfig,
            "compilation": CompilationConfig,
            "parallel": ParallelConfig,
            "scheduler": SchedulerConfig,
            "attention": AttentionConfig,
        }

    # ------------------------------------------------------------------ identity

    def compute_hash(self) -> str:
        """SHA-256 hex of everything that shapes the compiled graph.

        Combines the model, cache, compilation, parallel and attention hashes; per-rank
        knobs (memory shares, swap space, scheduler limits) leave it unchanged.
        The digest is the same in every process.
        """
        factors = [
            self.model.compute_hash(),
            self.cache.compute_hash(),
            self.compilation.compute_hash(),
            self.parallel.compute_hash(),
            self.attention.compute_hash(),
        ]
        return hashlib.sha256(str(factors).encode()).hexdigest()

    # ------------------------------------------------------------------ dicts and files

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of sections: enums by name, paths as strings,
        callables by qualified name; derived fields are left out."""
        return {name: getattr(self, name).to_dict() for name in self.section_types()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EngineConfig:
        """Build a config from a dict of sections; sections and fields may be partial.

        :raises ConfigError: an unknown section or field (the message lists the
            allowed ones), a section that is not a dict, or an invalid value
            (named by its ``section.field`` path).
        """
        if not isinstance(data, Mapping):
            raise ConfigError(
                f"engine config: expected a dict of sections, got {type(data).__name__}"
            )
        check_depth(data)
        types = cls.section_types()
        sections: dict[str, ConfigSection] = {}
        for name, body in data.items():
            if name not in types:
                raise ConfigError(
                    f"unknown config section {name!r}{did_you_mean(str(name), types)}; "
                    f"allowed sections: {', '.join(types)}"
                )
            sections[name] = _build_section(types[name], body)
        return cls(**sections)  # type: ignore[arg-type]

    @classmethod
    def from_file(cls, path: str | Path) -> EngineConfig:
        """Load a config from a ``.json``, ``.yaml``/``.yml`` or ``.toml`` file.

        :raises ConfigError: the file is missing, unreadable, too large or
            malformed (the message names the file and, where the parser says,
            the line), has an unsupported extension, or holds an invalid config.
        """
        data = cls.file_data(path)
        try:
            return cls.from_dict(data)
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from exc

    @classmethod
    def file_data(cls, path: str | Path) -> dict[str, Any]:
        """The parsed contents of a config file: a dict of sections, not yet validated.

        What :meth:`from_file` builds the config from; merge other values (the
        command line's ``--set``) into it first to get one config from both.

        :raises ConfigError: as :meth:`from_file`, for everything but the
            config's own validation.
        """
        path = Path(path)
        suffix = path.suffix.lower()
        if suffix not in _SUPPORTED_SUFFIXES:
            raise ConfigError(
                f"{path}: unsupported config file type {path.suffix or '(none)'!r}; "
                f"supported: {', '.join(_SUPPORTED_SUFFIXES)}"
            )
        try:
            with path.open("rb") as stream:
                raw = stream.read(MAX_FILE_BYTES + 1)
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read config file: {exc}") from exc
        if len(raw) > MAX_FILE_BYTES:
            raise ConfigError(
                f"{path}: config file is larger than {MAX_FILE_BYTES // 1024} KiB; "
                "an engine config is a few hundred bytes"
            )
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{path}: cannot read config file: not UTF-8 text ({exc})") from exc
        data = _parse(path, suffix, text)
        if data is None:  # an empty YAML document
            data = {}
        if not isinstance(data, dict):
            raise ConfigError(
                f"{path}: expected a mapping of sections at the top level, "
                f"got {type(data).__name__}"
            )
        # before anything merges or walks it: aliases can make a small file huge
        try:
            check_depth(data)
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from None
        return data

    @classmethod
    def json_schema(cls) -> dict[str, Any]:
        """The JSON schema of config files and ``from_dict`` input."""
        return TypeAdapter(cls).json_schema()

    # ------------------------------------------------------------------ capture sizes

    def default_cudagraph_capture_sizes(self) -> list[int]:
        """Capture sizes derived from the scheduler, ascending and deduplicated.

        One value N in ``scheduler.cuda_graph_sizes`` (when the user left it
        unset, ``min(2 * max_num_seqs, 512)`` of the current ``max_num_seqs``)
        expands to those of 1, 2, 4 not above N plus every multiple of 8 up to
        N; several values are
        used as given. Sizes above ``scheduler.max_num_batched_tokens`` are
        dropped, and with tensor and sequence parallelism so are sizes the
        tensor-parallel size does not divide.
        """
        scheduler = self.scheduler
        limit = scheduler.max_num_batched_tokens
        given = "cuda_graph_sizes" in scheduler.given_fields() and scheduler.cuda_graph_sizes
        requested = scheduler.cuda_graph_sizes if given else [scheduler.default_graph_size()]
        if len(requested) == 1:
            # Sizes above the token limit would be dropped anyway: do not build them.
            bound = min(requested[0], limit)
            sizes = [size for size in _SMALL_CAPTURE_SIZES if size <= bound]
            sizes += range(_CAPTURE_SIZE_STEP, bound + 1, _CAPTURE_SIZE_STEP)
        else:
            sizes = [size for size in requested if size <= limit]
        tp_size = self.parallel.tensor_parallel_size
        if tp_size > 1 and self.compilation.pass_config.enable_sequence_parallelism:
            sizes = [size for size in sizes if size % tp_size == 0]
        return sorted(set(sizes))


def _build_section(section_cls: type[ConfigSection], body: Any) -> ConfigSection:
    name = section_cls.section
    if isinstance(body, section_cls):
        return body.copy()
    if not isinstance(body, Mapping):
        raise ConfigError(
            f"config section {name!r} must be a dict of fields, got {type(body).__name__} "
            f"({body!r:.80})"
        )
    allowed = section_cls.init_field_names()
    for key in body:
        if not isinstance(key, str):
            raise ConfigError(
                f"{name}: field names must be strings, got {key!r}; "
                f"allowed fields: {', '.join(allowed)}"
            )
        if key not in allowed:
            raise ConfigError(
                f"{name}.{key}: unknown field{did_you_mean(key, allowed)}; "
                f"allowed fields: {', '.join(allowed)}"
            )
    try:
        return section_cls(**body)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, name)) from exc


def _parse(path: Path, suffix: str, text: str) -> Any:
    try:
        if suffix == ".json":
            try:
                return load_json(text)
            except json.JSONDecodeError as exc:
                raise ConfigError(
                    f"{path}: malformed JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}"
                ) from exc
        if suffix == ".toml":
            return _parse_toml(path, text)
        return _parse_yaml(path, text)
    except RecursionError:
        raise ConfigError(
            f"{path}: values are nested too deeply to read (at most {MAX_DEPTH} levels)"
        ) from None


def _parse_toml(path: Path, text: str) -> Any:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    long_number = _LONG_NUMBER.search(text)
    if long_number is not None:
        line = text.count("\n", 0, long_number.start()) + 1
        raise ConfigError(
            f"{path}: malformed TOML: a number at line {line} has more than "
            f"{_MAX_DIGITS} digits; numbers in an engine config are at most 2**60"
        )
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        # The message carries "(at line L, column C)".
        raise ConfigError(f"{path}: malformed TOML: {exc}") from exc


def _parse_yaml(path: Path, text: str) -> Any:
    import yaml

    try:
        return yaml.load(text, Loader=_yaml_loader())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{path}: malformed YAML{where}: {problem}") from exc


# Integers longer than this are not converted (Python refuses over 4300 digits,
# and converting them takes quadratic time); they fail validation as too large.
_MAX_DIGITS = 100
_LONG_NUMBER = re.compile(rf"[0-9_]{{{_MAX_DIGITS + 1},}}")


class OversizedNumber(float):
    """A number too long to convert: it stands in as infinity, so that validation
    names the field and says what is allowed (every bounded field refuses it)."""

    digits: int

    def __new__(cls, digits: int) -> OversizedNumber:
        self = super().__new__(cls, math.inf)
        self.digits = digits
        return self

    def __reduce__(self) -> tuple[Any, tuple[int]]:
        return OversizedNumber, (self.digits,)

    def __repr__(self) -> str:
        return f"<a number of {self.digits} digits>"

    @classmethod
    def of(cls, text: str) -> OversizedNumber:
        """The stand-in for the number written as ``text``."""
        return cls(len(text.strip().replace("_", "").lstrip("+-")))


def _parse_int(text: str) -> int | float:
    if len(text) > _MAX_DIGITS:
        return OversizedNumber.of(text)
    return int(text)


def load_json(text: str) -> Any:
    """``json.loads`` for config text: over-long integers become :class:`OversizedNumber`.

    :raises json.JSONDecodeError: malformed JSON.
    :raises RecursionError: nesting too deep for the parser.
    """
    return json.loads(text, parse_int=_parse_int)


@functools.cache
def _yaml_loader() -> type:
    import yaml

    class Loader(yaml.SafeLoader):
        """PyYAML's safe loader, with over-long integers kept as :class:`OversizedNumber`."""

        def construct_yaml_int(self, node: Any) -> Any:
            value = self.construct_scalar(node)
            if isinstance(value, str) and len(value.replace("_", "")) > _MAX_DIGITS:
                return OversizedNumber.of(value)
            return super().construct_yaml_int(node)

    Loader.add_constructor("tag:yaml.org,2002:int", Loader.construct_yaml_int)
    return Loader
