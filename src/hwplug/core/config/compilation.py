"""The compilation section: ``torch.compile`` levels, custom ops, passes and graph capture."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

from pydantic import ValidationInfo, WithJsonSchema, field_validator
from pydantic.dataclasses import dataclass
from pydantic.json_schema import SkipJsonSchema

from hwplug.core import versions
from hwplug.core.config._common import (
    CONFIG,
    MAX_SIZE,
    ConfigSection,
    Count,
    Size,
    check_depth,
    config_section,
    did_you_mean,
    jsonable,
    logger,
    qualified_name,
    resolve_qualname,
    stable_factors,
)
from hwplug.core.config.cudagraph_mode import CompilationLevel, CUDAGraphMode
from hwplug.core.config.pass_config import PassConfig
from hwplug.core.errors import ConfigError, brief
from hwplug.core.session import SessionProtocol, active_session

if TYPE_CHECKING:
    from hwplug.core.config.engine import EngineConfig

__all__ = ["CallableInductorPass", "CompilationConfig"]

# The entry of `compile_sizes` that stands for every capture size.
_CAPTURE_SIZES_TOKEN = "cudagraph_capture_sizes"
# Fields `__repr__` never shows: runtime bookkeeping, not settings.
_REPR_EXCLUDED = frozenset(
    {
        "static_forward_context",
        "enabled_custom_ops",
        "disabled_custom_ops",
        "compilation_time",
        "bs_to_padded_graph_size",
        "traced_files",
    }
)
_LEVELS = ", ".join(f"{level.value} ({level.name})" for level in CompilationLevel)

# JSON has no callables: the schema describes them as their qualified names.
_PassCallable = Annotated[Callable[..., Any], WithJsonSchema({"type": "string"})]
_GraphMode = Annotated[
    CUDAGraphMode,
    WithJsonSchema({"type": "string", "enum": [mode.name for mode in CUDAGraphMode]}),
]


class CallableInductorPass:
    """An inductor pass made from a plain callable.

    Calling it calls the callable on the graph. Its identity, for equality and
    for config hashes, is the callable's qualified name, which is the same in
    every process (an object's ``id`` or default ``repr`` is not).
    """

    def __init__(self, func: Callable[..., Any], name: str | None = None) -> None:
        self.func = func
        self.qualified_name = name or qualified_name(func)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.func(*args, **kwargs)

    def uuid(self) -> str:
        """SHA-256 hex of the qualified name: stable across processes."""
        return hashlib.sha256(self.qualified_name.encode()).hexdigest()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CallableInductorPass):
            return NotImplemented
        return self.qualified_name == other.qualified_name

    def __hash__(self) -> int:
        return hash(self.qualified_name)

    def __repr__(self) -> str:
        return f"CallableInductorPass({self.qualified_name})"


def _as_pass(obj: Any) -> Any:
    # An object with its own uuid() already is a pass; anything else gets wrapped.
    return obj if callable(getattr(obj, "uuid", None)) else CallableInductorPass(obj)


@config_section
@dataclass(config=CONFIG)
class CompilationConfig(ConfigSection):
    """How the model is compiled and which device graphs are captured.

    Three groups of settings: the compilation level and its backend, custom
    ops and splitting ops; inductor settings; and graph capture (mode, sizes,
    warm-ups). ``cudagraph_capture_sizes`` and the fields after
    ``pass_config`` are completed by ``init_with_cudagraph_sizes``.
    """

    section = "compilation"

    # -- compilation control
    level: int | None = None
    """Compilation level 0-3 (see ``CompilationLevel``); ``None`` lets the platform choose."""
    debug_dump_path: Path | None = None
    """Directory for compilation debugging output."""
    cache_dir: str = ""
    """Directory of the compiled-graph cache; empty derives one from the model."""
    backend: str = ""
    """``torch.compile`` backend for levels 1-2: a registered name or a qualified name."""
    custom_ops: list[str] = dataclasses.field(default_factory=list)
    """Custom ops to enable (``+op``) or disable (``-op``), after at most one ``all``/``none``."""
    splitting_ops: list[str] | None = None
    """Ops at which piecewise compilation splits the graph; ``None`` means the attention ops."""

    # -- inductor
    use_inductor: bool = True
    """Compile the pieces with inductor at level 3 (otherwise they run eagerly)."""
    compile_sizes: list[int | str] | None = None
    """Sizes inductor specialises for; ``"cudagraph_capture_sizes"`` adds the capture sizes."""
    inductor_compile_config: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Extra inductor options (resolved passes are added here)."""
    inductor_passes: dict[str, str | _PassCallable] = dataclasses.field(default_factory=dict)
    """Extra inductor passes: name -> callable or its qualified name."""

    # -- graph capture
    cudagraph_mode: _GraphMode | None = None
    """Which device graphs to capture (a mode name, any case); ``None`` lets the platform choose."""
    use_cudagraph: bool = True
    """Deprecated: ``False`` means ``cudagraph_mode=NONE``."""
    cudagraph_num_of_warmups: Count = 0
    """Eager runs of each size before its graph is captured."""
    cudagraph_capture_sizes: list[Size] | None = None
    """Batch sizes to capture graphs for; ``None`` derives them from the scheduler."""
    cudagraph_copy_inputs: bool = False
    """Copy inputs into static buffers before replay (piecewise graphs)."""
    full_cuda_graph: bool | None = False
    """Deprecated: ``True`` means ``cudagraph_mode=FULL``."""
    use_inductor_graph_partition: bool = False
    """Let inductor split the graph at graph-unsafe ops (needs torch >= 2.9)."""
    pass_config: PassConfig = dataclasses.field(default_factory=PassConfig)
    """Switches of the custom graph passes (a ``PassConfig`` or a dict of its fields)."""

    # -- derived, not set by users
    max_capture_size: SkipJsonSchema[int | None] = dataclasses.field(
        default=None, init=False, compare=False
    )
    """Largest capture size (0 when there are none); set by ``init_with_cudagraph_sizes``."""
    local_cache_dir: SkipJsonSchema[str | None] = dataclasses.field(
        default=None, init=False, compare=False
    )
    """This rank's compiled-graph cache directory."""
    bs_to_padded_graph_size: SkipJsonSchema[list[int] | None] = dataclasses.field(
        default=None, init=False, compare=False
    )
    """``[b]`` is the smallest capture size >= ``b`` (``[0]`` is 0), for O(1) padding."""
    enabled_custom_ops: SkipJsonSchema[Counter[str]] = dataclasses.field(
        default_factory=Counter, init=False, compare=False
    )
    """Custom ops the model instantiated enabled."""
    disabled_custom_ops: SkipJsonSchema[Counter[str]] = dataclasses.field(
        default_factory=Counter, init=False, compare=False
    )
    """Custom ops the model instantiated disabled."""
    traced_files: SkipJsonSchema[set[str]] = dataclasses.field(
        default_factory=set, init=False, compare=False
    )
    """Source files Dynamo traced."""
    compilation_time: SkipJsonSchema[float] = dataclasses.field(
        default=0.0, init=False, compare=False
    )
    """Seconds spent compiling."""
    static_forward_context: SkipJsonSchema[dict[str, Any]] = dataclasses.field(
        default_factory=dict, init=False, compare=False
    )
    """Layer name -> layer object, for layers reached outside the model code."""

    _attention_ops: ClassVar[list[str]] = [
        "vllm.unified_attention",
        "vllm.unified_attention_with_output",
        "vllm.mamba_mixer2",
        "vllm.mamba_mixer",
        "vllm.short_conv",
        "vllm.linear_attention",
        "vllm.plamo2_mamba_mixer",
        "vllm.gdn_attention",
        "vllm.sparse_attn_indexer",
    ]

    # ------------------------------------------------------------------ validators

    @field_validator("level", mode="before")
    @classmethod
    def _check_level(cls, value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, str):
            text = value.strip()
            if text in ("0", "1", "2", "3"):
                value = int(text)
            elif text.upper() in CompilationLevel.__members__:
                value = CompilationLevel[text.upper()]
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 3:
            return int(value)
        raise ConfigError(
            f"compilation.level: invalid level {brief(value)}; allowed levels: {_LEVELS}"
        )

    @field_validator("inductor_compile_config", "inductor_passes", mode="before")
    @classmethod
    def _check_nesting(cls, value: Any, info: ValidationInfo) -> Any:
        check_depth(value, f"compilation.{info.field_name}")
        return value

    @field_validator("compile_sizes", mode="before")
    @classmethod
    def _check_compile_sizes(cls, value: Any) -> Any:
        if value is None:
            return None
        if not isinstance(value, list | tuple):
            raise ConfigError(
                f"compilation.compile_sizes must be a list, got {brief(value)}; "
                f"entries are sizes 1..{MAX_SIZE} or the string {_CAPTURE_SIZES_TOKEN!r}"
            )
        for i, entry in enumerate(value):
            if isinstance(entry, str):
                continue  # checked when expanded (init_with_cudagraph_sizes)
            if isinstance(entry, bool) or not isinstance(entry, int) or not 1 <= entry <= MAX_SIZE:
                raise ConfigError(
                    f"compilation.compile_sizes[{i}]={brief(entry)} is not allowed; entries "
                    f"are sizes 1..{MAX_SIZE} or the string {_CAPTURE_SIZES_TOKEN!r}"
                )
        return list(value)

    @field_validator("cudagraph_mode", mode="before")
    @classmethod
    def _parse_cudagraph_mode(cls, value: Any) -> Any:
        return None if value is None else CUDAGraphMode.parse(value)

    @field_validator("custom_ops")
    @classmethod
    def _check_custom_ops(cls, ops: list[str]) -> list[str]:
        switches = [op for op in ops if op in ("all", "none")]
        if len(switches) > 1:
            raise ConfigError(
                f"compilation.custom_ops: 'all'/'none' may appear at most once in total, "
                f"got {switches}; allowed: one optional 'all' or 'none', then '+op'/'-op' entries"
            )
        for op in ops:
            if op in ("all", "none"):
                continue
            if len(op) < 2 or op[0] not in "+-":
                raise ConfigError(
                    f"compilation.custom_ops: invalid entry {op!r}; entries must be 'all', "
                    "'none', '+op' or '-op' (op being a registered custom op name)"
                )
        return ops

    @field_validator("pass_config", mode="before")
    @classmethod
    def _check_pass_config_keys(cls, value: Any) -> Any:
        if isinstance(value, dict):
            allowed = PassConfig.init_field_names()
            for key in value:
                if key not in allowed:
                    raise ConfigError(
                        f"compilation.pass_config.{key}: unknown field"
                        f"{did_you_mean(str(key), allowed)}; allowed fields: {', '.join(allowed)}"
                    )
        return value

    @field_validator("use_inductor_graph_partition")
    @classmethod
    def _check_graph_partition(cls, enabled: bool) -> bool:
        if enabled and not versions.torch_version_at_least("2.9"):
            found = versions.torch_version()
            have = "not installed" if found is None else ".".join(map(str, found))
            raise ConfigError(
                "compilation.use_inductor_graph_partition=True needs torch >= 2.9 "
                f"(torch here: {have}); set it to False"
            )
        return enabled

    def __post_init__(self) -> None:
        # Custom passes rely on auto-functionalization v1 (v2 is on by default since 2.6).
        if versions.torch_version_at_least("2.6"):
            self.inductor_compile_config.setdefault("enable_auto_functionalized_v2", False)
        for name, spec in self.inductor_passes.items():
            self.inductor_compile_config[name] = _as_pass(self._load_pass(name, spec))
        self._migrate_deprecated_flags()

    @staticmethod
    def _load_pass(name: str, spec: Any) -> Any:
        if not isinstance(spec, str):
            return spec
        try:
            func = resolve_qualname(spec)
        except Exception as exc:
            raise ConfigError(
                f"compilation.inductor_passes[{name!r}]: cannot import {spec!r} ({exc}); "
                "give a callable or its qualified name, such as 'package.module.function'"
            ) from exc
        if not callable(func):
            raise ConfigError(
                f"compilation.inductor_passes[{name!r}]: {spec!r} is a "
                f"{type(func).__name__}, not a callable"
            )
        return func

    def _migrate_deprecated_flags(self) -> None:
        if not self.use_cudagraph:
            _deprecated("compilation.use_cudagraph", "compilation.cudagraph_mode='NONE'")
            if self.cudagraph_mode not in (None, CUDAGraphMode.NONE):
                raise ConfigError(
                    "compilation.use_cudagraph=False and compilation.cudagraph_mode="
                    f"{self.cudagraph_mode} are mutually exclusive; set only "
                    "compilation.cudagraph_mode (use_cudagraph is deprecated)"
                )
            self.cudagraph_mode = CUDAGraphMode.NONE
        if self.full_cuda_graph:
            _deprecated("compilation.full_cuda_graph", "compilation.cudagraph_mode='FULL'")
            if self.cudagraph_mode is not None and not self.cudagraph_mode.has_full_cudagraphs():
                raise ConfigError(
                    "compilation.full_cuda_graph=True and compilation.cudagraph_mode="
                    f"{self.cudagraph_mode} are mutually exclusive; set only "
                    "compilation.cudagraph_mode (full_cuda_graph is deprecated)"
                )
            self.cudagraph_mode = CUDAGraphMode.FULL

    # ------------------------------------------------------------------ identity

    def compute_hash(self) -> str:
        """SHA-256 hex of the settings that change the compiled graph.

        The factors are the level, backend, custom ops, splitting ops,
        ``use_inductor``, the inductor config and passes, and the pass config's
        ``uuid()``; callables among them count by qualified name, so the digest
        is the same in every process. Capture sizes and other runtime settings
        do not change it.
        """
        factors: list[Any] = [
            self.level,
            self.backend,
            self.custom_ops,
            self.splitting_ops,
            self.use_inductor,
            self.inductor_compile_config,
            self.inductor_passes,
            self.pass_config.uuid(),
        ]
        return hashlib.sha256(str(stable_factors(factors)).encode()).hexdigest()

    def __repr__(self) -> str:
        """The settings that differ from the defaults, as a dict."""
        defaults = _default_repr_values()
        shown: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.name in _REPR_EXCLUDED:
                continue
            value = getattr(self, f.name)
            if f.name == "pass_config":
                changed = {
                    key: item
                    for key, item in value.to_dict().items()
                    if item != defaults["pass_config"][key]
                }
                if changed:
                    shown[f.name] = changed
                continue
            if f.name == "inductor_compile_config":
                value = {k: v for k, v in value.items() if k != "post_grad_custom_post_pass"}
            value = jsonable(value)
            if value != defaults[f.name]:
                shown[f.name] = value
        return str(shown)

    __str__ = __repr__

    # ------------------------------------------------------------------ backends

    def init_backend(
        self, engine_config: EngineConfig | None = None, *, session: SessionProtocol | None = None
    ) -> str | Callable[..., Any]:
        """The ``torch.compile`` backend for this level (imports torch).

        Levels 1-2: ``"eager"`` when ``backend`` is empty, a backend name
        registered with Dynamo as is, else the object ``backend`` names as a
        qualified name. Level 3: the piecewise backend of ``session`` (default:
        the active session, :mod:`hwplug.core.session`): hwplug's own,
        capturing with the session's platform.

        :raises ConfigError: no compilation level is set, or ``backend`` names
            nothing that can be used.
        """
        if not self.level:
            raise ConfigError(
                f"compilation.level: no compilation level is set (level={self.level}), so "
                f"there is no backend to build; allowed levels with a backend: 1 "
                f"(DYNAMO_AS_IS), 2 (DYNAMO_ONCE), 3 (PIECEWISE)"
            )
        if self.level in (CompilationLevel.DYNAMO_AS_IS, CompilationLevel.DYNAMO_ONCE):
            if self.backend == "":
                return "eager"
            registered = _registered_backends()
            if self.backend in registered:
                return self.backend
            try:
                backend: Callable[..., Any] = resolve_qualname(self.backend)
            except Exception as exc:
                raise ConfigError(
                    f"compilation.backend: {self.backend!r} is neither a registered "
                    f"torch.compile backend ({', '.join(sorted(registered))}) nor an importable "
                    f"qualified name ({exc})"
                ) from exc
            return backend
        try:
            active = session or active_session("compilation level 3 (PIECEWISE)")
            assert active is not None  # active_session raises when none and a purpose is given
            result: Callable[..., Any] = active.piecewise_backend(self, engine_config)
        except RuntimeError as exc:
            raise ConfigError(
                f"compilation.level=3 (PIECEWISE) has no backend here ({exc}); use level 1 or 2"
            ) from exc
        return result

    # ------------------------------------------------------------------ capture sizes

    def init_with_cudagraph_sizes(self, cudagraph_capture_sizes: list[int]) -> None:
        """Finish the config once the capture sizes are known.

        Explicit ``cudagraph_capture_sizes`` win over the argument. Sizes are
        deduplicated and sorted descending; ``compile_sizes`` is deduplicated
        with ``"cudagraph_capture_sizes"`` expanded; ``max_capture_size`` and
        the padding table ``bs_to_padded_graph_size`` are computed.

        :raises ConfigError: ``compile_sizes`` holds a string other than
            ``"cudagraph_capture_sizes"``; the config is left unchanged.
        """
        if self.cudagraph_capture_sizes is None:
            requested = list(cudagraph_capture_sizes)
        else:
            requested = list(self.cudagraph_capture_sizes)
            if sorted(set(requested)) != sorted(set(cudagraph_capture_sizes)):
                logger.info(
                    "capture sizes %s are overridden by compilation.cudagraph_capture_sizes %s",
                    cudagraph_capture_sizes,
                    requested,
                )
        sizes = sorted(set(requested), reverse=True)

        compile_sizes: list[int] = []
        for entry in self.compile_sizes or []:
            if isinstance(entry, str):
                if entry != _CAPTURE_SIZES_TOKEN:
                    raise ConfigError(
                        f"compilation.compile_sizes: unknown entry {entry!r}; entries are "
                        f"integers or the string {_CAPTURE_SIZES_TOKEN!r}"
                    )
                compile_sizes.extend(sizes)
            else:
                compile_sizes.append(entry)

        max_size = sizes[0] if sizes else 0
        table = [0] * (max_size + 1)
        smaller = 0
        for size in reversed(sizes):
            table[smaller + 1 : size + 1] = [size] * (size - smaller)
            smaller = size

        self.cudagraph_capture_sizes = sizes
        self.compile_sizes = list(dict.fromkeys(compile_sizes))
        self.max_capture_size = max_size
        self.bs_to_padded_graph_size = table

    # ------------------------------------------------------------------ splitting ops

    def set_splitting_ops_for_v1(self) -> None:
        """Choose the splitting ops for piecewise compilation (level 3 only).

        - inductor graph partition: no splitting ops (inductor splits);
        - attention fusion: see ``set_splitting_ops_for_attn_fusion``;
        - unset: the attention ops;
        - empty: piecewise graphs are impossible, so ``PIECEWISE`` becomes
          ``NONE`` and ``FULL_AND_PIECEWISE`` becomes ``FULL``.

        :raises ConfigError: the level is not 3 (PIECEWISE).
        """
        if self.level != CompilationLevel.PIECEWISE:
            raise ConfigError(
                f"compilation.level: splitting ops apply only to level 3 (PIECEWISE), "
                f"got {self.level}"
            )
        if self.use_inductor_graph_partition:
            self.set_splitting_ops_for_inductor_graph_partition()
            return
        if self.pass_config.enable_attn_fusion:
            self.set_splitting_ops_for_attn_fusion()
            return
        if self.splitting_ops is None:
            # A copy: the class-level list must never be mutated through a config.
            self.splitting_ops = list(self._attention_ops)
            return
        if not self.splitting_ops:
            logger.warning("piecewise compilation with empty compilation.splitting_ops")
            if self.cudagraph_mode == CUDAGraphMode.PIECEWISE:
                logger.warning(
                    "empty compilation.splitting_ops leave no piecewise graphs: "
                    "compilation.cudagraph_mode PIECEWISE becomes NONE (FULL or "
                    "FULL_DECODE_ONLY give full graphs where the attention backend allows)"
                )
                self.cudagraph_mode = CUDAGraphMode.NONE
            elif self.cudagraph_mode == CUDAGraphMode.FULL_AND_PIECEWISE:
                logger.warning(
                    "empty compilation.splitting_ops leave no piecewise graphs: "
                    "compilation.cudagraph_mode FULL_AND_PIECEWISE becomes FULL"
                )
                self.cudagraph_mode = CUDAGraphMode.FULL
            self.splitting_ops = []

    def set_splitting_ops(self) -> None:
        """Alias of ``set_splitting_ops_for_v1``."""
        self.set_splitting_ops_for_v1()

    def set_splitting_ops_for_inductor_graph_partition(self) -> None:
        """With inductor graph partition the splitting ops are ignored: set them empty.

        :raises ConfigError: ``use_inductor_graph_partition`` is off.
        """
        if not self.use_inductor_graph_partition:
            raise ConfigError(
                "compilation.use_inductor_graph_partition is False; splitting ops for graph "
                "partition apply only when it is True"
            )
        if self.splitting_ops:
            logger.warning(
                "compilation.splitting_ops %s are ignored with use_inductor_graph_partition=True "
                "(graph-unsafe ops are tagged instead) and set to []",
                self.splitting_ops,
            )
        self.splitting_ops = []

    def set_splitting_ops_for_attn_fusion(self) -> None:
        """Attention fusion needs attention inside the compiled pieces.

        Unset splitting ops become empty, and a mode with piecewise graphs
        becomes ``FULL``.

        :raises ConfigError: attention fusion is off, or the splitting ops
            contain the attention ops.
        """
        if not self.pass_config.enable_attn_fusion:
            raise ConfigError(
                "compilation.pass_config.enable_attn_fusion is False; splitting ops for "
                "attention fusion apply only when it is True"
            )
        if self.splitting_ops is None:
            self.splitting_ops = []
            if self.cudagraph_mode is not None and self.cudagraph_mode.has_piecewise_cudagraphs():
                logger.warning(
                    "attention fusion without inductor graph partition rules out piecewise "
                    "graphs: compilation.cudagraph_mode %s becomes FULL (set it to NONE if the "
                    "attention backend cannot be captured)",
                    self.cudagraph_mode,
                )
                self.cudagraph_mode = CUDAGraphMode.FULL
        if self.splitting_ops_contain_attention():
            raise ConfigError(
                "compilation.splitting_ops must not contain the attention ops when "
                "compilation.pass_config.enable_attn_fusion is True; remove them or turn "
                "attention fusion off"
            )

    def splitting_ops_contain_attention(self) -> bool:
        """Whether every attention op is a splitting op."""
        return self.splitting_ops is not None and all(
            op in self.splitting_ops for op in self._attention_ops
        )

    def is_attention_compiled_piecewise(self) -> bool:
        """Whether attention runs outside the compiled pieces (FX split or inductor partition)."""
        level = self.level or CompilationLevel.NO_COMPILATION
        piecewise = level == CompilationLevel.PIECEWISE
        fx_split = piecewise and self.splitting_ops_contain_attention()
        inductor_used = (piecewise and self.use_inductor) or (
            level >= CompilationLevel.DYNAMO_AS_IS and self.backend == "inductor"
        )
        inductor_split = (
            inductor_used
            and self.use_inductor_graph_partition
            and not self.splitting_ops_contain_attention()
        )
        return fx_split or inductor_split

    def custom_op_log_check(self) -> None:
        """Log the enabled and disabled custom ops; warn about ``custom_ops`` entries
        naming ops the model does not have (they have no effect)."""
        if not self.enabled_custom_ops and not self.disabled_custom_ops:
            logger.debug("no custom ops found in the model")
            return
        logger.debug("enabled custom ops: %s", self.enabled_custom_ops)
        logger.debug("disabled custom ops: %s", self.disabled_custom_ops)
        in_model = self.enabled_custom_ops | self.disabled_custom_ops
        for op in self.custom_ops:
            if op in ("all", "none"):
                continue
            name = op[1:]
            if name not in in_model:
                action = "enabling" if op[0] == "+" else "disabling"
                logger.warning(
                    "compilation.custom_ops: op %r is not present in the model, so %s it "
                    "with %r has no effect",
                    name,
                    action,
                    op,
                )


def _registered_backends() -> list[str]:
    # Importing Dynamo takes seconds: only `init_backend` does it, and only for a name.
    from torch._dynamo.backends.registry import list_backends

    return list(list_backends(exclude_tags=()))


def _deprecated(flag: str, replacement: str) -> None:
    message = f"{flag} is deprecated; use {replacement} instead"
    warnings.warn(message, DeprecationWarning, stacklevel=4)
    logger.warning(message)


@functools.cache
def _default_repr_values() -> dict[str, Any]:
    # The defaults' printable values, for `CompilationConfig.__repr__` to compare with.
    default = CompilationConfig()
    values = {f.name: jsonable(getattr(default, f.name)) for f in dataclasses.fields(default)}
    values["pass_config"] = default.pass_config.to_dict()
    return values
