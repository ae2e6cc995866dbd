"""The engine config: every section together, with loading, saving and hashing."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError
from pydantic.dataclasses import dataclass

from hwplug.core.config._common import (
    CONFIG,
    ConfigSection,
    config_section,
    did_you_mean,
    format_validation_error,
)
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

    @classmethod
    def section_types(cls) -> dict[str, type[ConfigSection]]:
        """Section name -> config class."""
        return {
            "model": ModelConfig,
            "cache": CacheConfig,
            "compilation": CompilationConfig,
            "parallel": ParallelConfig,
            "scheduler": SchedulerConfig,
        }

    # ------------------------------------------------------------------ identity

    def compute_hash(self) -> str:
        """SHA-256 hex of everything that shapes the compiled graph.

        Combines the model, cache, compilation and parallel hashes; per-rank
        knobs (memory shares, swap space, scheduler limits) leave it unchanged.
        The digest is the same in every process.
        """
        factors = [
            self.model.compute_hash(),
            self.cache.compute_hash(),
            self.compilation.compute_hash(),
            self.parallel.compute_hash(),
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

        :raises ConfigError: the file is missing, unreadable or malformed (the
            message names the file and, where the parser says, the line), has an
            unsupported extension, or holds an invalid config.
        """
        path = Path(path)
        suffix = path.suffix.lower()
        if suffix not in _SUPPORTED_SUFFIXES:
            raise ConfigError(
                f"{path}: unsupported config file type {path.suffix or '(none)'!r}; "
                f"supported: {', '.join(_SUPPORTED_SUFFIXES)}"
            )
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: cannot read config file: {exc}") from exc
        data = _parse(path, suffix, text)
        if data is None:  # an empty YAML document
            data = {}
        if not isinstance(data, dict):
            raise ConfigError(
                f"{path}: expected a mapping of sections at the top level, "
                f"got {type(data).__name__}"
            )
        try:
            return cls.from_dict(data)
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from exc

    @classmethod
    def json_schema(cls) -> dict[str, Any]:
        """The JSON schema of config files and ``from_dict`` input."""
        return TypeAdapter(cls).json_schema()

    # ------------------------------------------------------------------ capture sizes

    def default_cudagraph_capture_sizes(self) -> list[int]:
        """Capture sizes derived from the scheduler, ascending and deduplicated.

        One value N in ``scheduler.cuda_graph_sizes`` expands to those of 1, 2,
        4 not above N plus every multiple of 8 up to N; several values are
        used as given. Sizes above ``scheduler.max_num_batched_tokens`` are
        dropped, and with tensor and sequence parallelism so are sizes the
        tensor-parallel size does not divide.
        """
        scheduler = self.scheduler
        limit = scheduler.max_num_batched_tokens
        requested = scheduler.cuda_graph_sizes or [scheduler.default_graph_size()]
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
    if suffix == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"{path}: malformed JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}"
            ) from exc
    if suffix == ".toml":
        if sys.version_info >= (3, 11):
            import tomllib
        else:  # pragma: no cover - Python 3.10
            import tomli as tomllib
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            # The message carries "(at line L, column C)".
            raise ConfigError(f"{path}: malformed TOML: {exc}") from exc
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{path}: malformed YAML{where}: {problem}") from exc
