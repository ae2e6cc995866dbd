"""The support matrix: what every platform and device profile supports.

One :class:`MatrixRow` per simulated profile (or, with ``installed=True``, per
platform detected on this machine), computed from the platforms' own rules,
so the table can never drift from the code. ``hwplug matrix`` prints it, and
``docs/support-matrix.md`` is generated from it by
``scripts/gen_support_matrix.py``.

Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

from hwplug.core.config import CompilationLevel, CUDAGraphMode, EngineConfig, ModelConfig
from hwplug.core.errors import ConfigError
from hwplug.core.platform import Platform
from hwplug.plugins.current import default_session
from hwplug.plugins.loading import BUILTIN_DISTRIBUTION
from hwplug.plugins.plugin_manager import HwplugPluginManager
from hwplug.plugins.selection import PlatformEntry
from hwplug.plugins.session import Session

__all__ = [
    "MatrixRow",
    "builtin_plugin_manager",
    "graph_modes",
    "ordered_entries",
    "render_markdown",
    "support_matrix",
    "support_matrix_page",
]


PAGE_TITLE = "# Support matrix"
PAGE_INTRO = """\
What each platform supports on each simulated device profile, computed from
the platforms' own rules. The device column gives the compute capability or
the GPU architecture. Block sizes show the default in bold, then every allowed
size in brackets; MLA is multi-head latent attention (`model.use_mla`). The
fp8 format is the torch dtype that `cache.cache_dtype="fp8"` (or the
platform's own name for its fp8 cache, its `fp8_cache_dtype`) stores on that
device; "none" where the device does not accept it (an explicit format such
as `fp8_e5m2` may still be listed among the KV-cache dtypes). The attention
column is the backend a default configuration resolves to (`attention.backend`
left unset).

This page is generated: run `python scripts/gen_support_matrix.py` (the same
as `HWPLUG_PLUGINS= hwplug matrix --format markdown`) after changing a
platform's rules. A test fails while it is stale. With vendor plugins
installed, `hwplug matrix` shows their platforms too.
"""


@dataclasses.dataclass(frozen=True)
class MatrixRow:
    """What one platform supports on one device (a simulated profile or detected)."""

    platform: str
    """Platform name (``cuda``)."""
    profile: str | None
    """Simulated profile name, or None for a device detected on this machine."""
    device: str
    """The device, as in error messages (name, capability or architecture)."""
    device_name: str
    """The device's marketing name."""
    capability: str | None
    """Compute capability (``"9.0"``) where it applies."""
    arch: str | None
    """ISA generation (``"gfx942"``) where known."""
    device_count: int
    """Number of devices (1 for profiles)."""
    total_memory: int
    """Memory of one device in bytes (0 when unknown)."""
    distribution: str
    """The Python distribution that provides the platform."""
    priority: int
    """Selection priority of the platform."""
    dist_backend: str
    """``torch.distributed`` backend."""
    default_block_size: int
    """Block size filled in when ``cache.block_size`` is unset."""
    block_sizes: tuple[int, ...]
    """Allowed block sizes."""
    mla_default_block_size: int
    """Default block size for MLA models."""
    mla_block_sizes: tuple[int, ...]
    """Allowed block sizes for MLA models."""
    cache_dtypes: tuple[str, ...]
    """KV-cache dtypes this device can store."""
    fp8_format: str | None
    """torch dtype that the platform's fp8 cache dtype (``fp8_cache_dtype``) stores here;
    None where it is not accepted."""
    model_dtypes: tuple[str, ...]
    """Model dtypes, most preferred first."""
    graph_modes: tuple[str, ...]
    """``compilation.cudagraph_mode`` values the platform accepts."""
    default_compilation_level: str
    """Compilation level filled in when unset, as ``NAME (n)``."""
    attention_backend: str | None = None
    """The attention backend a default config resolves to here (None: none fits)."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (tuples as lists)."""
        return {
            field.name: list(value) if isinstance(value, tuple) else value
            for field in dataclasses.fields(self)
            for value in [getattr(self, field.name)]
        }


def builtin_plugin_manager() -> HwplugPluginManager:
    """A private plugin manager holding only hwplug's built-in platforms.

    Used for output that must not depend on the vendor plugins installed here
    (the documentation's support matrix).
    """
    manager = HwplugPluginManager(strict=True)
    manager.load_builtins()
    return manager


def graph_modes(
    platform: Platform | type[Platform], session: Session | None = None
) -> tuple[str, ...]:
    """Names of the ``cudagraph_mode`` values ``platform`` accepts.

    For a platform bound to a device: the modes a default configuration
    resolves with unchanged there in ``session`` (default: the default
    session), so the device's graph wrapper, the default attention backend's
    graph support and the session's plugins count. For a class: ``NONE``,
    and with device graphs every mode except those that need piecewise
    capture where the platform captures whole graphs only.
    """
    if isinstance(platform, Platform):
        chosen = session if session is not None else default_session()
        return tuple(mode.name for mode in CUDAGraphMode if _resolves_with(platform, mode, chosen))
    if not platform.supports_device_graphs:
        return (CUDAGraphMode.NONE.name,)
    return tuple(
        mode.name
        for mode in CUDAGraphMode
        if platform.supports_piecewise_graphs or not mode.requires_piecewise_compilation()
    )


def _resolves_with(platform: Platform, mode: Any, session: Session) -> bool:
    config = EngineConfig.from_dict({"compilation": {"cudagraph_mode": mode.name}})
    try:
        resolution = session.resolve(config, platform=platform)
        return bool(resolution.config.compilation.cudagraph_mode == mode)
    except ConfigError:
        return False


def _level_name(level: int) -> str:
    try:
        return f"{CompilationLevel(level).name} ({int(level)})"
    except ValueError:
        return str(level)


def _row(platform: Platform, entry: PlatformEntry, session: Session) -> MatrixRow:
    plain = EngineConfig()
    mla = EngineConfig(model=ModelConfig(use_mla=True))
    cache_dtypes = tuple(platform.supported_cache_dtypes())
    # the cache dtype that stores fp8_dtype() has its own name on some platforms
    has_fp8 = platform.fp8_cache_dtype in cache_dtypes
    device = platform.device
    return MatrixRow(
        platform=platform.name,
        profile=platform.profile.partition(":")[0]
        if platform.simulated and platform.profile
        else None,
        device=platform.describe_device(),
        device_name=device.name if device is not None else platform.name,
        capability=device.capability.as_version_str()
        if device is not None and device.capability is not None
        else None,
        arch=device.arch if device is not None else None,
        device_count=len(platform.devices),
        total_memory=device.total_memory if device is not None else 0,
        distribution=entry.distribution,
        priority=platform.priority,
        dist_backend=platform.dist_backend,
        default_block_size=platform.default_block_size(plain),
        block_sizes=tuple(platform.supported_block_sizes(plain.model)),
        mla_default_block_size=platform.default_block_size(mla),
        mla_block_sizes=tuple(platform.supported_block_sizes(mla.model)),
        cache_dtypes=cache_dtypes,
        fp8_format=platform.fp8_dtype_name if has_fp8 else None,
        model_dtypes=tuple(platform.supported_model_dtypes()),
        graph_modes=graph_modes(platform, session),
        default_compilation_level=_level_name(platform.default_compilation_level),
        attention_backend=_default_backend(platform, session),
    )


def _default_backend(platform: Platform, session: Session) -> str | None:
    """The attention backend resolution chooses for a default config on ``platform``."""
    try:
        resolution = session.resolve(platform=platform)
    except ConfigError:
        return None
    return resolution.config.attention.backend


# How the built-in platforms are listed (the most used first).
_DISPLAY_ORDER = ("cuda", "rocm", "cpu", "hpu", "xpu")


def ordered_entries(entries: dict[str, PlatformEntry]) -> list[PlatformEntry]:
    """Platforms in display order: built-ins as cuda, rocm, cpu, hpu, xpu, then by name."""

    def key(item: tuple[str, PlatformEntry]) -> tuple[int, int, str]:
        name, entry = item
        if entry.distribution == BUILTIN_DISTRIBUTION and name in _DISPLAY_ORDER:
            return (0, _DISPLAY_ORDER.index(name), name)
        return (1, 0, name)

    return [entry for _name, entry in sorted(entries.items(), key=key)]


def support_matrix(
    manager: HwplugPluginManager | Session | None = None, *, installed: bool = False
) -> list[MatrixRow]:
    """The support matrix of every platform a session's plugins provide.

    By default one row per simulated profile of every platform (built-ins in
    the order cuda, rocm, cpu, hpu, xpu, then vendor platforms by name). With
    ``installed``, only the platforms whose devices are present on this
    machine, one row each for the detected devices. ``manager`` is a
    :class:`~hwplug.Session` or a plugin manager (a session of its own is made
    for it, so only its plugins take part: its platforms, hooks and attention
    backends); default: the default session.
    """
    session = _session_of(manager)
    manager = session.plugin_manager
    rows: list[MatrixRow] = []
    for entry in ordered_entries(manager.platform_entries()):
        cls = entry.cls
        if installed:
            candidate = manager.detect(entry)
            if candidate.present:
                rows.append(_row(cls(candidate.devices), entry, session))
            continue
        for profile in cls.profiles():
            rows.append(_row(cls.simulate(profile), entry, session))
    return rows


def _session_of(given: HwplugPluginManager | Session | None) -> Session:
    if given is None:
        return default_session()
    if isinstance(given, Session):
        return given
    if isinstance(given, HwplugPluginManager):
        return Session(given)
    raise ConfigError(
        f"support_matrix() takes a Session or a HwplugPluginManager, got {type(given).__name__}"
    )


# --------------------------------------------------------------------------- markdown


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _blocks(default: int, allowed: Sequence[int]) -> str:
    return f"**{default}** ({', '.join(str(size) for size in allowed)})"


def _joined(values: Iterable[str]) -> str:
    unique = list(dict.fromkeys(values))
    return " / ".join(unique)


def _device_cell(row: MatrixRow) -> str:
    # gfx names say more than the capability derived from them; NVIDIA has only the latter.
    detail = row.arch if row.arch and row.arch.startswith("gfx") else row.capability or row.arch
    count = f"{row.device_count} x " if row.device_count > 1 else ""
    return f"{count}{row.device_name}" + (f" ({detail})" if detail else "")


def render_markdown(rows: Sequence[MatrixRow]) -> str:
    """Markdown: a summary table of the platforms, then a table of profiles per platform."""
    by_platform: dict[str, list[MatrixRow]] = {}
    for row in rows:
        by_platform.setdefault(row.platform, []).append(row)
    if not by_platform:
        return "No platform to show.\n"
    lines = [
        "| platform | priority | dist backend | default compilation level | graph modes |",
        "|---|---|---|---|---|",
    ]
    for name, group in by_platform.items():
        summary = (
            f"[{name}](#{name})",
            _joined(str(r.priority) for r in group),
            _joined(f"`{r.dist_backend}`" for r in group),
            _joined(r.default_compilation_level for r in group),
            _joined(", ".join(r.graph_modes) for r in group),
        )
        lines.append("| " + " | ".join(_cell(c) for c in summary) + " |")
    for name, group in by_platform.items():
        lines += [
            "",
            f"## {name}",
            "",
            f"Provided by the `{_joined(r.distribution for r in group)}` distribution.",
            "",
            "| profile | device | block sizes | MLA block sizes | KV-cache dtypes | fp8 format "
            "| model dtypes | attention |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for row in group:
            cells = (
                f"`{row.profile}`" if row.profile else "detected",
                _device_cell(row),
                _blocks(row.default_block_size, row.block_sizes),
                _blocks(row.mla_default_block_size, row.mla_block_sizes),
                ", ".join(row.cache_dtypes),
                row.fp8_format or "none",
                ", ".join(row.model_dtypes),
                f"`{row.attention_backend}`" if row.attention_backend else "none",
            )
            lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def support_matrix_page(manager: HwplugPluginManager | Session | None = None) -> str:
    """The whole ``docs/support-matrix.md`` page (built-in platforms by default)."""
    manager = manager if manager is not None else builtin_plugin_manager()
    return f"{PAGE_TITLE}\n\n{PAGE_INTRO}\n{render_markdown(support_matrix(manager))}"
