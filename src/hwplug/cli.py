"""The ``hwplug`` command: inspect platforms, plugins and profiles; resolve configs.

Installed as ``hwplug`` and runnable as ``python -m hwplug``::

    hwplug info [--json]
    hwplug plugins [--json]
    hwplug profiles [--json]
    hwplug resolve [--platform NAME | --simulate PROFILE] [--config FILE]
                   [--set section.field=value ...] [--json]
    hwplug matrix [--format table|markdown|json] [--installed]
    hwplug conformance NAME [--profile P] [--kind rule|runtime] [--skip ID=REASON ...]
                       [--timeout SECONDS] [--json]

Every user error (a bad option, an unknown profile, platform or field, a
malformed config file, a config the platform cannot run) ends the command with
exit status 2 and one line on stderr, ``hwplug: error: ...``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text
from typer.core import TyperGroup

import hwplug
from hwplug._version import __version__
from hwplug.core.errors import ConfigError, PluginError, one_line
from hwplug.plugins.manager import PluginWarning, get_plugin_manager, select_platform
from hwplug.plugins.selection import did_you_mean

if TYPE_CHECKING:
    from pydantic import ValidationError

    from hwplug.core.config import EngineConfig
    from hwplug.core.platform import DeviceInfo, Platform
    from hwplug.plugins.manager import HwplugPluginManager

# The config models (pydantic), the support matrix and resolution are imported by the
# commands that use them: `hwplug --help` and `hwplug info` do without.

__all__ = ["CliError", "app", "main", "parse_set_option"]

PROG = "hwplug"
EXIT_USAGE = 2
"""Exit status of every user error."""

EXIT_CLOSED_PIPE = 141
"""Exit status when the reader of stdout has gone (``hwplug matrix | head``): what a shell
reports for a Unix tool that ``SIGPIPE`` ended (128 + 13), as ``seq 1 99999 | head -1``
gives; nothing is printed."""

MATRIX_FORMATS = ("table", "markdown", "json")


class _Commands(TyperGroup):
    """Typer's group, listing each command with the whole first sentence of its help
    (wrapped to the terminal), not the first 45 characters or so."""

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit=10_000)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


app = typer.Typer(
    cls=_Commands,
    name=PROG,
    help="Inspect hwplug's platforms, plugins and device profiles, and resolve engine configs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


# --------------------------------------------------------------------------- errors


class CliError(ConfigError):
    """A user error detected by the command line itself (exit status 2)."""


class _ReaderGone(Exception):
    """stdout's reader has gone. Not an ``OSError``: click would turn that into status 1."""


def _closed_pipe() -> int:
    """Stop quietly, as Unix tools do when their reader has gone. stdout becomes
    ``/dev/null``, so that the interpreter's last flush does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_CLOSED_PIPE


def _out(text: str, *, nl: bool = True) -> None:
    """Print ``text`` on stdout."""
    try:
        typer.echo(text, nl=nl)
    except BrokenPipeError:
        raise _ReaderGone from None


class _Console(Console):
    """rich's console, whose closed pipe ends the command as :func:`_out`'s does (rich's
    own ends the interpreter with status 1)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise _ReaderGone


def _validation_message(exc: ValidationError) -> str:
    """One ``section.field: message`` line from a pydantic ``ValidationError``."""
    # lazy: the config models stay out of --help (under 1 s, no torch)
    from hwplug.core.config import EngineConfig

    sections = {cls.__name__: name for name, cls in EngineConfig.section_types().items()}
    prefix = sections.get(exc.title)
    parts = []
    for error in exc.errors():
        loc = [str(part) for part in error.get("loc", ())]
        if prefix and (not loc or loc[0] != prefix):
            loc.insert(0, prefix)
        where = ".".join(loc) or exc.title
        message = error.get("msg", "invalid value")
        if "input" in error and error.get("type") != "missing":
            message += f" (got {error['input']!r:.60})"
        parts.append(f"{where}: {message}")
    return one_line("; ".join(parts)) or one_line(str(exc))


def _error_message(exc: BaseException) -> str | None:
    """The one-line message for a user error, or None for anything else (a bug)."""
    from typer._click import exceptions as click_exc

    if isinstance(exc, click_exc.UsageError):
        text = exc.format_message()
        ctx = exc.ctx
        hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
        return one_line(text) + hint
    if isinstance(exc, click_exc.ClickException):
        return one_line(exc.format_message())
    pydantic = sys.modules.get("pydantic")  # no pydantic loaded: not a ValidationError
    if pydantic is not None and isinstance(exc, pydantic.ValidationError):
        return _validation_message(exc)
    if isinstance(exc, CliError | ConfigError | PluginError):
        return one_line(str(exc))
    import yaml

    if isinstance(exc, yaml.YAMLError):
        return "malformed YAML: " + one_line(str(exc))
    if isinstance(exc, ValueError):
        return one_line(str(exc)) or type(exc).__name__
    return None


class _Buffer(logging.Handler):
    """Holds hwplug's log warnings so that a failing command prints only its error."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


_buffers: list[_Buffer] = []


def _warnings_so_far() -> list[str]:
    """The warnings hwplug logged during this command (also printed to stderr at the end)."""
    if not _buffers:
        return []
    return [one_line(record.getMessage()) for record in _buffers[-1].records]


@contextlib.contextmanager
def _quiet_library() -> Iterator[_Buffer]:
    """Route hwplug's warnings (log records and ``warnings``) into a buffer."""
    logger = logging.getLogger("hwplug")
    buffer = _Buffer()
    _buffers.append(buffer)
    propagate = logger.propagate
    logger.addHandler(buffer)
    logger.propagate = False
    try:
        with warnings.catch_warnings():
            # Each of these is also logged (and shown once, from the buffer).
            warnings.simplefilter("ignore", PluginWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            yield buffer
    finally:
        _buffers.remove(buffer)
        logger.removeHandler(buffer)
        logger.propagate = propagate


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``hwplug`` command with ``argv`` (default: ``sys.argv[1:]``).

    Returns the exit status: 0 on success, 2 after a user error (reported as
    one ``hwplug: error: ...`` line on stderr).
    """
    from typer._click import exceptions as click_exc

    args = list(sys.argv[1:] if argv is None else argv)
    with _quiet_library() as buffer:
        try:
            result = app(args=args, prog_name=PROG, standalone_mode=False)
        except click_exc.NoArgsIsHelpError as exc:
            if exc.ctx is not None:
                try:
                    _out(exc.ctx.get_help())
                except _ReaderGone:
                    return _closed_pipe()
            return 0
        except _ReaderGone:
            return _closed_pipe()
        except typer.Abort:
            typer.echo(f"{PROG}: error: aborted", err=True)
            return 1
        except Exception as exc:
            message = _error_message(exc)
            if message is None:
                raise
            typer.echo(f"{PROG}: error: {message}", err=True)
            return EXIT_USAGE
    for record in buffer.records:
        typer.echo(f"{PROG}: warning: {one_line(record.getMessage())}", err=True)
    return result if isinstance(result, int) else 0


# --------------------------------------------------------------------------- output


# Width of piped and captured output when COLUMNS does not say.
_PIPE_WIDTH = 200


def _console() -> Console:
    """A console as wide as the terminal, or ``COLUMNS``; pipes default to 200 columns.

    Table cells wrap (fold) rather than being cut short, so field paths and
    values stay whole at any width.
    """
    columns = os.environ.get("COLUMNS", "").strip()
    width = int(columns) if columns.isascii() and columns.isdecimal() and int(columns) > 0 else None
    console = _Console(highlight=False, soft_wrap=False, width=width)
    if width is None and not console.is_terminal:
        console = _Console(highlight=False, width=_PIPE_WIDTH, soft_wrap=False)
    return console


@contextlib.contextmanager
def _status(*, quiet: bool) -> Iterator[Callable[[str], None]]:
    """A status line on stderr for long work, on a terminal only (nothing under ``--json``
    or when stderr is not a terminal); yields the function that updates it."""
    import sys

    if quiet or not sys.stderr.isatty():
        yield lambda text: None
        return
    with Console(stderr=True).status("") as status:
        yield status.update


def _print_json(data: Any) -> None:
    _out(json.dumps(data, indent=2, sort_keys=False))


def _table(title: str, *columns: str) -> Table:
    table = Table(title=Text(title, style="bold"), title_justify="left")
    for column in columns:
        # a header is never broken inside a word
        table.add_column(
            column, overflow="fold", min_width=max(map(len, column.split()), default=1)
        )
    return table


_LONGEST_WORD = 40
"""Words up to this long are kept whole in a table cell."""

_READABLE = 16
"""Fewest columns a wrapped table cell may get before rows are printed as blocks instead."""


def _plain(cell: object) -> list[str]:
    """The lines of a table cell's text."""
    return (cell.plain if isinstance(cell, Text) else str(cell)).splitlines() or [""]


def _print_table(console: Console, table: Table) -> None:
    """Print ``table``; when the console is too narrow for its columns (headers whole,
    paths and names kept whole), print each row as a block instead: the first cell as a
    heading, then one line per other column, its text wrapped (no column is dropped)."""
    columns = table.columns
    chrome = 3 * len(columns) + 1  # borders and padding
    # whole headers, paths and words (a word longer than 40 may still fold)
    least = [
        max(
            column.min_width or 1,
            min(
                _LONGEST_WORD,
                max((len(w) for c in column.cells for w in " ".join(_plain(c)).split()), default=1),
            ),
        )
        for column in columns
    ]
    natural = [
        max(
            [
                len(str(column.header)),
                *(len(line) for cell in column.cells for line in _plain(cell)),
            ]
        )
        for column in columns
    ]
    room = console.width - chrome
    if sum(natural) <= room:
        console.print(table)
        return
    if sum(least) <= room:
        # fixed widths: each column its least, the rest shared by what each would like
        # more; cells then wrap inside their column (no column is cut off)
        widths = list(least)
        extra = room - sum(widths)
        while extra > 0:  # water-filling: the spare columns go equally to those wanting more
            wanting = [i for i, w in enumerate(widths) if w < natural[i]]
            if not wanting:
                break
            share = max(1, extra // len(wanting))
            for i in wanting:
                grant = min(share, natural[i] - widths[i], extra)
                widths[i] += grant
                extra -= grant
        if all(w >= min(n, _READABLE) for w, n in zip(widths, natural)):
            for column, width in zip(columns, widths):
                column.width = width
            console.print(table)
            return
    if table.title is not None:
        console.print(table.title)
    columns = table.columns
    rows = list(zip(*(list(column.cells) for column in columns)))
    label = max(len(str(column.header)) for column in columns[1:]) if len(columns) > 1 else 0
    for row in rows:
        value = row[0].plain if isinstance(row[0], Text) else str(row[0])
        console.print(Text.assemble((f"{columns[0].header} ", "dim"), (value, "bold")))
        block = Table.grid(padding=(0, 1))
        block.add_column(no_wrap=True, min_width=label + 2)
        block.add_column(overflow="fold")
        for column, cell in zip(columns[1:], row[1:]):
            block.add_row(Text(f"  {column.header}"), cell)
        console.print(block)


def _keep_whole(table: Table, column: int, texts: Iterable[str], limit: int = 40) -> None:
    """Give ``column`` room for its longest text (up to ``limit``): field paths and
    plugin names are read whole; the other cells fold around them (or, on a console
    too narrow for that, :func:`_print_table` prints the rows as blocks)."""
    width = max((len(text) for text in texts), default=0)
    table.columns[column].min_width = min(width, limit)


def _cells(*values: object) -> list[Text]:
    """Table cells as plain text: square brackets are never taken for markup."""
    return [Text("" if value is None else str(value)) for value in values]


def _memory(total: int) -> str:
    if total <= 0:
        return "unknown"
    return f"{total / (1 << 30):.1f} GiB"


def _device_row(index: int, device: DeviceInfo) -> list[Text]:
    return _cells(
        index,
        device.name,
        _memory(device.total_memory),
        device.capability.as_version_str() if device.capability else "",
        device.arch or "",
        device.vendor,
        ", ".join(sorted(device.features)),
    )


def _line(console: Console, *parts: tuple[str, str]) -> None:
    text = Text()
    for value, style in parts:
        text.append(value, style=style)
    console.print(text)


def _platform_label(platform: Platform) -> str:
    if platform.simulated:
        return f"simulated profile {platform.profile}"
    return "detected"


# --------------------------------------------------------------------------- commands


def _show_version(value: bool) -> None:
    if value:
        _out(f"{PROG} {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(
        False,
        "--version",
        callback=_show_version,
        is_eager=True,
        help="Show the hwplug version and exit.",
    ),
) -> None:
    """Inspect hwplug's platforms, plugins and device profiles, and resolve engine configs."""


@app.command()
def info(
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
) -> None:
    """The platform this process runs on, its devices, and how it was chosen.

    Honours HWPLUG_PLATFORM, HWPLUG_SIMULATE and HWPLUG_PLUGINS.
    """
    manager = get_plugin_manager()
    selection = select_platform()
    platform = selection.platform
    plugins = [p.to_dict() for p in manager.plugin_info.values()]
    failures = [f.to_dict() for f in manager.failures]
    if as_json:
        _print_json(
            {
                "platform": platform.name,
                "simulated": platform.simulated,
                "profile": platform.profile,
                "device": platform.describe_device(),
                "devices": [d.to_dict() for d in platform.devices],
                "candidates": [c.to_dict() for c in selection.candidates],
                "reason": selection.reason,
                "plugins": plugins,
                "failures": failures,
                "version": __version__,
            }
        )
        return
    console = _console()
    _line(
        console,
        ("Platform: ", "bold"),
        (platform.name, "bold green"),
        (f" ({_platform_label(platform)}) on {platform.describe_device()}", ""),
    )
    _line(console, ("Chosen because: ", "bold"), (selection.reason, ""))
    _line(
        console,
        ("torch device type: ", "bold"),
        (platform.device_type or "-", ""),
        ("   distributed backend: ", "bold"),
        (platform.dist_backend or "-", ""),
        ("   hwplug ", "bold"),
        (__version__, ""),
    )
    devices = _table(
        f"Devices ({len(platform.devices)})",
        "#",
        "name",
        "memory",
        "capability",
        "arch",
        "vendor",
        "features",
    )
    for i, device in enumerate(platform.devices):
        devices.add_row(*_device_row(i, device))
    _print_table(console, devices)
    candidates = _table(
        "Candidate platforms",
        "platform",
        "plugin",
        "distribution",
        "priority",
        "probe",
        "devices",
        "",
    )
    for c in selection.candidates:
        if c.error:
            probe = f"failed: {c.error}"
        elif not c.probed:
            probe = "not probed"
        else:
            probe = "present" if c.present else "absent"
        chosen = "chosen" if c.name == platform.name else ""
        candidates.add_row(
            *_cells(c.name, c.plugin, c.distribution, c.priority, probe, len(c.devices), chosen)
        )
    _print_table(console, candidates)
    _print_plugins(console, manager)


def _print_plugins(console: Console, manager: HwplugPluginManager) -> None:
    table = _table("Plugins", "name", "group", "distribution", "version", "module", "built-in")
    for p in manager.plugin_info.values():
        table.add_row(
            *_cells(p.name, p.group, p.distribution, p.version, p.value, "yes" if p.builtin else "")
        )
    _print_table(console, table)
    if manager.failures:
        failed = _table("Plugins that failed", "plugin", "distribution", "stage", "error")
        for f in manager.failures:
            failed.add_row(*_cells(f.plugin, f.distribution, f.stage, f.error))
        _print_table(console, failed)


@app.command()
def plugins(
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """The plugins loaded (built-in and third-party) with their distributions.

    HWPLUG_PLUGINS limits the third-party plugins; failures are listed too.
    """
    manager = get_plugin_manager()
    entries = manager.platform_entries()
    if as_json:
        _print_json(
            {
                "plugins": [
                    {
                        **p.to_dict(),
                        "platforms": sorted(n for n, e in entries.items() if e.plugin == p.name),
                    }
                    for p in manager.plugin_info.values()
                ],
                "failures": [f.to_dict() for f in manager.failures],
            }
        )
        return
    _print_plugins(_console(), manager)


@app.command()
def profiles(
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Every simulated device profile, usable with --simulate and HWPLUG_SIMULATE."""
    # lazy: the support matrix stay out of --help (under 1 s, no torch)
    from hwplug import matrix as support

    manager = get_plugin_manager()
    known = manager.known_profiles()
    rows: list[tuple[str, str, bool, DeviceInfo]] = []
    for entry in support.ordered_entries(manager.platform_entries()):
        for name in entry.cls.profiles():
            platform, device = known.get(name, ("", None))
            if platform == entry.cls.name and device is not None:
                rows.append((name, platform, entry.cls.representative_profile == name, device))
    if as_json:
        _print_json(
            [
                {"name": name, "platform": platform, "representative": rep, "device": dev.to_dict()}
                for name, platform, rep, dev in rows
            ]
        )
        return
    console = _console()
    table = _table(
        "Device profiles (* = the platform's representative profile)",
        "profile",
        "platform",
        "device",
        "memory",
        "capability",
        "arch",
        "features",
    )
    for name, platform, rep, dev in rows:
        table.add_row(
            *_cells(
                name + (" *" if rep else ""),
                platform,
                dev.name,
                _memory(dev.total_memory),
                dev.capability.as_version_str() if dev.capability else "",
                dev.arch or "",
                ", ".join(sorted(dev.features)),
            )
        )
    _print_table(console, table)


# --------------------------------------------------------------------------- resolve


def parse_set_option(text: str) -> tuple[list[str], Any]:
    """Split ``section.field=value`` into the path and the value.

    The value is read as JSON where it parses (``32``, ``true``, ``null``,
    ``[]``, ``{"a": 1}``), else kept as the string (``FULL``).

    :raises CliError: the text is not ``section.field=value``.
    """
    # lazy: the config models stay out of --help (under 1 s, no torch)
    from hwplug.core.config import EngineConfig
    from hwplug.core.config._common import check_depth
    from hwplug.core.config.engine import load_json

    key, sep, raw = text.partition("=")
    key = key.strip()
    sections = list(EngineConfig.section_types())
    if not sep or not key:
        raise CliError(
            f"--set {text!r}: expected section.field=value, as in --set cache.block_size=32"
        )
    path = key.split(".")
    if len(path) < 2 or not all(path):
        raise CliError(
            f"--set {text!r}: {key!r} is not a section.field path; sections: "
            f"{', '.join(sections)} (as in --set cache.block_size=32)"
        )
    section, field = path[0], path[1]
    types = EngineConfig.section_types()
    if section not in types:
        raise CliError(f"--set {text!r}: unknown section {section!r}; sections: {', '.join(types)}")
    fields = types[section].init_field_names()
    if field not in fields:
        from difflib import get_close_matches

        close = get_close_matches(field, fields, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise CliError(
            f"--set {text!r}: {section} has no field {field!r}{hint}; "
            f"{section} fields: {', '.join(fields)}"
        )
    if len(path) > 2 and not _has_subfields(types[section], field):
        raise CliError(
            f"--set {text!r}: {section}.{field} is a plain value, not a section of fields; "
            f"use --set {section}.{field}=VALUE"
        )

    try:
        value = load_json(raw)
    except RecursionError:
        raise CliError(f"--set {key}=...: the value is nested too deeply to read") from None
    except ValueError:
        value = raw
    check_depth(value, key)
    return path, value


def _has_subfields(section_cls: type, name: str) -> bool:
    """Whether a field holds a dict or a nested config (so ``a.b.c=v`` can reach into it)."""
    import dataclasses

    for field in dataclasses.fields(section_cls):
        if field.name == name:
            if field.default_factory is not dataclasses.MISSING:
                default = field.default_factory()
            else:
                default = field.default
            return isinstance(default, dict) or dataclasses.is_dataclass(default)
    return False


def _apply_set(data: dict[str, Any], text: str, path: list[str], value: Any) -> None:
    node = data
    for depth, part in enumerate(path[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            where = ".".join(path[: depth + 1])
            raise CliError(f"--set {text!r}: {where} is {child!r}, not a section of fields")
        node = child
    node[path[-1]] = value


def _load_config(config_file: Path | None, assignments: Sequence[str]) -> EngineConfig:
    """The config of ``--config`` with the ``--set`` values on top.

    The values are merged into the file's own data before anything is
    validated, so a file plus ``--set`` gives exactly what one source holding
    both would: only what the user wrote counts as set.
    """
    # lazy: the config models stay out of --help (under 1 s, no torch)
    from hwplug.core.config import EngineConfig

    parsed = [(text, *parse_set_option(text)) for text in assignments]
    data = {} if config_file is None else EngineConfig.file_data(config_file)
    for text, path, value in parsed:
        _apply_set(data, text, path, value)
    try:
        return EngineConfig.from_dict(data)
    except ConfigError as exc:
        if config_file is None or not parsed:
            where = f"{config_file}: " if config_file is not None else ""
            raise ConfigError(f"{where}{exc}") from exc
        raise ConfigError(f"{config_file} with --set: {exc}") from exc


def _choose_platform(platform: str | None, simulate: str | None) -> Platform | None:
    if platform is not None and simulate is not None:
        raise CliError(
            "--platform and --simulate are mutually exclusive; --platform picks a platform by "
            "name, --simulate a device profile (which implies its platform)"
        )
    manager = get_plugin_manager()
    if simulate is not None:
        return manager.simulate(simulate)
    if platform is not None:
        name = platform.strip().lower()
        entries = manager.platform_entries()
        if name not in entries:
            hint = (
                f" ({name!r} is a device profile: use --simulate {name})"
                if name.partition(":")[0] in manager.known_profiles()
                else did_you_mean(name, entries)
            )
            raise CliError(
                f"--platform: unknown platform {platform!r}{hint}; known platforms: "
                f"{', '.join(sorted(entries))}"
            )
        return manager.platform_from_spec(name)
    return None


def _value_text(value: Any, limit: int = 12) -> str:
    """JSON text of a config value; long lists are shortened for people (not in --json)."""
    if isinstance(value, list) and len(value) > limit:
        head = ", ".join(json.dumps(v) for v in value[:6])
        tail = ", ".join(json.dumps(v) for v in value[-2:])
        return f"[{head}, ..., {tail}] ({len(value)} items)"
    return json.dumps(value)


@app.command()
def resolve(
    platform: str | None = typer.Option(
        None,
        "--platform",
        metavar="NAME",
        help="Resolve for this platform (the detected device, else its representative profile).",
    ),
    simulate: str | None = typer.Option(
        None,
        "--simulate",
        metavar="PROFILE",
        help="Resolve for a simulated device profile, as in h100 or h100:8.",
    ),
    config: Path | None = typer.Option(  # noqa: B008
        None,
        "--config",
        metavar="FILE",
        help="A JSON, YAML or TOML config file; sections and fields may be partial.",
    ),
    assignments: list[str] = typer.Option(  # noqa: B008
        [],
        "--set",
        metavar="SECTION.FIELD=VALUE",
        help=(
            "Set a field on top of the file (repeatable). Values are read as JSON where they "
            "parse: --set cache.block_size=32 --set compilation.cudagraph_mode=FULL."
        ),
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
) -> None:
    """Resolve an engine config for a platform: the result and every change, with reasons."""
    target = _choose_platform(platform, simulate)
    engine_config = _load_config(config, assignments)
    resolution = hwplug.resolve(engine_config, platform=target)
    data = resolution.to_dict()
    if as_json:
        _print_json(
            {
                **data,
                "simulated": resolution.platform.simulated,
                "profile": resolution.platform.profile,
                "device": resolution.platform.describe_device(),
                "warnings": _warnings_so_far(),
            }
        )
        return
    console = _console()
    plat = resolution.platform
    _line(
        console,
        ("Resolved for ", "bold"),
        (plat.name, "bold green"),
        (f" ({_platform_label(plat)}) on {plat.describe_device()}", ""),
    )
    changed = {c.path for c in resolution.changes}
    table = _table("Resolved configuration (* = changed by resolution)", "field", "value")
    for section, fields in data["config"].items():
        for name, value in fields.items():
            path = f"{section}.{name}"
            mark = " *" if path in changed else ""
            table.add_row(*_cells(path + mark, _value_text(value)))
    _keep_whole(table, 0, (f"{s}.{n} *" for s, fields in data["config"].items() for n in fields))
    _print_table(console, table)
    changes = _table(
        f"Changes ({len(resolution.changes)})", "field", "old", "new", "source", "reason"
    )
    _keep_whole(changes, 0, (c["path"] for c in data["changes"]))
    _keep_whole(changes, 3, (c["source"] for c in data["changes"]))
    for change in data["changes"]:
        changes.add_row(
            *_cells(
                change["path"],
                _value_text(change["old"]),
                _value_text(change["new"]),
                change["source"],
                change["reason"],
            )
        )
    _print_table(console, changes)


# --------------------------------------------------------------------------- matrix


@app.command()
def matrix(
    output_format: str = typer.Option(
        "table",
        "--format",
        metavar="FORMAT",
        help="Output format: table (default), markdown or json.",
    ),
    installed: bool = typer.Option(
        False,
        "--installed",
        help="Only the platforms present on this machine, with their detected devices.",
    ),
) -> None:
    """The support matrix of every platform and device profile.

    Block sizes (default and allowed, also for MLA), KV-cache dtypes, the fp8
    format, model dtypes, graph modes, default compilation level and
    distributed backend.
    """
    # lazy: the support matrix stay out of --help (under 1 s, no torch)
    from hwplug import matrix as support

    fmt = output_format.strip().lower()
    if fmt not in MATRIX_FORMATS:
        raise CliError(
            f"--format: unknown format {output_format!r}; choose one of: "
            f"{', '.join(MATRIX_FORMATS)}"
        )
    rows = support.support_matrix(installed=installed)
    if fmt == "json":
        _print_json([row.to_dict() for row in rows])
        return
    if fmt == "markdown":
        if installed:
            text = f"{support.PAGE_TITLE} (this machine)\n\n{support.render_markdown(rows)}"
        else:
            text = support.support_matrix_page(get_plugin_manager())
        _out(text, nl=False)
        return
    console = _console()
    if not rows:
        console.print(Text("No platform to show."))
    groups: dict[str, list[support.MatrixRow]] = {}
    for row in rows:
        groups.setdefault(row.platform, []).append(row)
    for name, group in groups.items():
        first = group[0]
        title = (
            f"{name} ({first.distribution}): priority {first.priority}, dist backend "
            f"{first.dist_backend}, default level {first.default_compilation_level}, "
            f"graph modes {', '.join(first.graph_modes)}"
        )
        table = _table(
            title,
            "profile",
            "device",
            "memory",
            "blocks (default; allowed)",
            "MLA blocks",
            "KV-cache dtypes",
            "fp8",
            "model dtypes",
            "attention",
        )
        for row in group:
            table.add_row(
                *_cells(
                    row.profile or "detected",
                    row.device if row.device_count <= 1 else f"{row.device_count} x {row.device}",
                    _memory(row.total_memory),
                    f"{row.default_block_size}; {', '.join(map(str, row.block_sizes))}",
                    f"{row.mla_default_block_size}; {', '.join(map(str, row.mla_block_sizes))}",
                    ", ".join(row.cache_dtypes),
                    row.fp8_format or "none",
                    ", ".join(row.model_dtypes),
                    row.attention_backend or "none",
                )
            )
        _print_table(console, table)


# --------------------------------------------------------------------------- conformance


@app.command()
def conformance(
    name: str = typer.Argument(..., metavar="NAME", help="The platform to certify (npu, cuda...)."),
    profile: str | None = typer.Option(
        None,
        "--profile",
        metavar="PROFILE",
        help="Run on this simulated profile of the platform (default: the detected device, "
        "else the representative profile).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    skips: list[str] = typer.Option(  # noqa: B008
        [],
        "--skip",
        metavar="ID=REASON",
        help="Skip a check, saying why (repeatable): --skip T04='no transformers on the farm'.",
    ),
    kind: str | None = typer.Option(
        None, "--kind", metavar="KIND", help="Run only the rule or only the runtime checks."
    ),
    timeout: str | None = typer.Option(
        None,
        "--timeout",
        metavar="SECONDS",
        help="How long one check may run before it fails as hung (default 600).",
    ),
) -> int:
    """Check that a platform keeps hwplug's contract; exit status 1 when a check fails."""
    # lazy: the conformance kit needs hypothesis (the test extra), loaded only when asked for
    from hwplug.conformance import KINDS, CheckContext, load_platform, run_checks

    skip: dict[str, str] = {}
    for text in skips:
        check_id, sep, reason = text.partition("=")
        if not sep or not check_id.strip() or not reason.strip():
            raise CliError(f"--skip {text!r}: give ID=REASON, as in --skip T04='no GPU here'")
        skip[check_id.strip().upper()] = reason.strip()
    kinds = KINDS
    if kind is not None:
        if kind.strip().lower() not in KINDS:
            raise CliError(f"--kind: unknown kind {kind!r}; choose one of: {', '.join(KINDS)}")
        kinds = (kind.strip().lower(),)  # type: ignore[assignment]
    limit: dict[str, float] = {}
    if timeout is not None:
        try:
            seconds = float(timeout)
        except ValueError:
            seconds = float("nan")
        if not 0 < seconds < float("inf"):
            raise CliError(f"--timeout {timeout!r}: give a positive number of seconds, as in 300")
        limit["timeout"] = seconds
    platform = load_platform(name, profile)
    context = CheckContext.for_platform(platform, **limit)
    with _status(quiet=as_json) as show:
        report = run_checks(
            platform,
            kinds=kinds,
            skip=skip,
            context=context,
            progress=lambda id, title, i, n: show(f"{id} {title} ({i + 1}/{n})"),
        )
    if as_json:
        _print_json(report.to_dict())
        return 0 if report.ok else 1
    console = _console()
    table = _table(
        f"hwplug conformance {report.to_dict()['conformance_version']}", "check", "result", "reason"
    )
    styles = {"pass": "green", "fail": "bold red", "skip": "yellow"}
    _keep_whole(table, 0, (f"{r.id} {r.title}" for r in report.results))
    for result in report.results:
        check_cell, _, reason_cell = _cells(f"{result.id} {result.title}", "", result.reason)
        table.add_row(check_cell, Text(result.outcome, style=styles[result.outcome]), reason_cell)
    _print_table(console, table)
    _line(console, (report.summary(), "bold green" if report.ok else "bold red"))
    return 0 if report.ok else 1
