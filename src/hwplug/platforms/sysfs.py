"""Reading what the kernel publishes: bounded, torch-free, never raising.

The shared readers of every built-in probe: files under a filesystem root
(``$HWPLUG_PROBE_ROOT`` or ``/``), PCI functions in sysfs, visibility
variables (``CUDA_VISIBLE_DEVICES`` and its kin), and the open/query/close of
a vendor management library (NVML, amdsmi). Every read is bounded (regular
files only, at most 1 MiB); numbers are read in ASCII digits only; a missing,
unreadable or malformed value is skipped and logged at debug level on the
``hwplug.probes`` logger.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from hwplug.core.platform import MAX_MEMORY, DeviceInfo

__all__ = [
    "AMDSMI",
    "NVML",
    "PROBE_ROOT_ENV",
    "Found",
    "Library",
    "PciFunction",
    "apply_visibility",
    "decimal",
    "exists",
    "is_host_root",
    "library_text",
    "list_dir",
    "meminfo_total",
    "memory_bytes",
    "numbered",
    "parse_uint",
    "pci_functions",
    "prop_int",
    "query_library",
    "read_fields",
    "read_int",
    "read_properties",
    "read_text",
    "resolve_env",
    "resolve_root",
    "uuid_resolver",
]

logger = logging.getLogger("hwplug.probes")

PROBE_ROOT_ENV = "HWPLUG_PROBE_ROOT"
"""Environment variable naming the filesystem root probes read (default ``/``)."""

T = TypeVar("T")


def resolve_root(root: str | os.PathLike[str] | None) -> Path:
    if root is None:
        root = os.environ.get(PROBE_ROOT_ENV) or "/"
    return Path(root)


def resolve_env(env: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if env is None else env


def is_host_root(root: Path) -> bool:
    """Whether ``root`` is the real ``/`` (vendor libraries describe only that)."""
    try:
        return root.resolve() == Path(os.sep).resolve()
    except (OSError, RuntimeError):
        return False


def exists(path: Path) -> bool:
    # os.path.exists, unlike Path.exists, never raises (a permission error is False).
    return os.path.exists(path)


# Every read is bounded: sysfs attributes hold at most a page, /proc/cpuinfo
# of a large host a few hundred KiB.
_READ_LIMIT = 1 << 20
_MAX_DIGITS = 40


def read_text(path: Path) -> str | None:
    """The first MiB of a regular file, or None (missing, unreadable, or not a regular
    file: a device node or FIFO linked into the tree is never read)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        logger.debug("cannot read %s: %s", path, exc.strerror or exc)
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            logger.debug("%s is not a regular file; not read", path)
            return None
        with os.fdopen(fd, "rb", closefd=False) as stream:
            data = stream.read(_READ_LIMIT)
    except OSError as exc:
        logger.debug("cannot read %s: %s", path, exc.strerror or exc)
        return None
    finally:
        os.close(fd)
    return data.decode("utf-8", errors="replace")


def memory_bytes(value: int, what: object) -> int:
    """A memory figure as reported, or 0 (unknown) when it is beyond 2**60 bytes."""
    if 0 <= value <= MAX_MEMORY:
        return value
    logger.debug("%s: memory figure %d is out of range; treated as unknown", what, value)
    return 0


def decimal(text: str) -> int | None:
    """A non-negative ASCII decimal of at most 40 digits, else None (``²`` is not one)."""
    text = text.strip()
    if text and len(text) <= _MAX_DIGITS and text.isascii() and text.isdecimal():
        return int(text)
    return None


def parse_uint(text: str) -> int | None:
    """A non-negative decimal (``206158430208``) or hex (``0x10de``) number, else None.

    Every number the probes read (ids, classes, sizes) is non-negative.
    """
    text = text.strip()
    value = decimal(text)
    if value is not None:
        return value
    digits = text[2:]
    if (
        text[:2].lower() == "0x"
        and 0 < len(digits) <= _MAX_DIGITS
        and all(c in "0123456789abcdefABCDEF" for c in digits)
    ):
        return int(digits, 16)
    return None


def read_int(path: Path) -> int | None:
    """An integer file such as sysfs ``vendor`` (``0x10de``) or a decimal size."""
    text = read_text(path)
    if text is None:
        return None
    value = parse_uint(text)
    if value is None:
        logger.debug("%s does not hold a non-negative integer: %r", path, text[:40])
    return value


def read_properties(path: Path) -> dict[str, str]:
    """``key value`` lines, as in the KFD topology ``properties`` files."""
    text = read_text(path)
    if text is None:
        return {}
    props: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        if key:
            props[key] = value.strip()
    return props


def read_fields(path: Path) -> dict[str, str]:
    """``Key: value`` lines, as in ``/proc/driver/nvidia/gpus/*/information``."""
    text = read_text(path)
    if text is None:
        return {}
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip().lower()] = value.strip()
    return fields


def prop_int(props: Mapping[str, str], key: str) -> int | None:
    text = props.get(key)
    if text is None:
        return None
    value = parse_uint(text)
    if value is None:
        logger.debug("property %s is not a non-negative integer: %r", key, text)
    return value


def list_dir(path: Path) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def numbered(path: Path, prefix: str) -> list[tuple[int, Path]]:
    """Entries ``<prefix><n>`` of a directory, sorted by ``n``."""
    found = []
    for name in list_dir(path):
        number = decimal(name[len(prefix) :]) if name.startswith(prefix) else None
        if number is not None:
            found.append((number, path / name))
    return sorted(found)


def meminfo_total(root: Path) -> int:
    """``MemTotal`` of ``/proc/meminfo`` in bytes, 0 when unknown."""
    fields = read_fields(root / "proc/meminfo")
    value = fields.get("memtotal", "")
    text, _, unit = value.partition(" ")
    number = decimal(text)
    if number is None:
        return 0
    return memory_bytes(number * (1024 if unit.strip().lower() == "kb" else 1), "MemTotal")


@dataclass(frozen=True)
class PciFunction:
    address: str
    path: Path
    vendor: int
    device: int
    pci_class: int
    driver: str | None

    @property
    def is_display(self) -> bool:
        return self.pci_class >> 16 == 0x03


def pci_functions(root: Path, vendor: int) -> list[PciFunction]:
    """PCI functions of ``vendor`` in ``/sys/bus/pci/devices``, in bus order."""
    base = root / "sys/bus/pci/devices"
    found = []
    for address in list_dir(base):
        path = base / address
        if read_int(path / "vendor") != vendor:
            continue
        device = read_int(path / "device")
        pci_class = read_int(path / "class")
        if device is None or pci_class is None:
            logger.debug("pci %s: no readable device id or class; skipped", address)
            continue
        try:
            driver: str | None = os.path.basename(os.readlink(path / "driver"))
        except OSError:
            driver = None
        found.append(PciFunction(address, path, vendor, device, pci_class, driver))
    return found


def apply_visibility(
    devices: Sequence[T],
    env: Mapping[str, str],
    var: str,
    resolve: Callable[[str], int | None],
    *,
    empty_means_all: bool = False,
    collapse_repeats: bool = False,
) -> list[T]:
    """The devices ``env[var]`` selects, in the order it lists them.

    ``resolve`` maps one entry to an index into ``devices`` (None: invalid).
    Unset selects everything; empty selects nothing unless
    ``empty_means_all``. An invalid entry, or a repeated device unless
    ``collapse_repeats``, ends the list there, as the CUDA driver does.
    """
    value = env.get(var)
    if value is None:
        return list(devices)
    if not value.strip():
        if empty_means_all:
            return list(devices)
        logger.debug("%s is empty: no device visible", var)
        return []
    chosen: list[int] = []
    for entry in (part.strip() for part in value.split(",")):
        index = resolve(entry) if entry else None
        if index is None or not 0 <= index < len(devices):
            logger.debug("%s=%r: entry %r is not a visible device; list ends", var, value, entry)
            break
        if index in chosen:
            if collapse_repeats:
                continue
            logger.debug("%s=%r: entry %r repeats a device; list ends", var, value, entry)
            break
        chosen.append(index)
    return [devices[i] for i in chosen]


def uuid_resolver(uuids: Sequence[str | None]) -> Callable[[str], int | None]:
    """Resolve an index, or a full or unique-prefix UUID (case-insensitive)."""

    def resolve(entry: str) -> int | None:
        index = decimal(entry)
        if index is not None:
            return index
        wanted = entry.lower()
        matches = [i for i, uuid in enumerate(uuids) if uuid and uuid.lower().startswith(wanted)]
        return matches[0] if len(matches) == 1 else None

    return resolve


@dataclass(frozen=True)
class Found:
    """A detected device plus what visibility variables match on."""

    info: DeviceInfo
    uuid: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def library_text(value: object) -> str:
    """A string from a vendor library, which may return bytes (older pynvml releases)."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


# ---------------------------------------------------------------------------
# Vendor management libraries
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Library:
    """How to open and close one vendor management library."""

    module: str
    """The Python module (``pynvml``, ``amdsmi``)."""
    init: str
    """Its initialisation function."""
    shutdown: str
    """Its shutdown function."""
    label: str
    """A short name for messages (``NVML``)."""
    error: str
    """The library's own exception class: the failures it reports about the machine."""


NVML = Library("pynvml", "nvmlInit", "nvmlShutdown", "NVML", "NVMLError")
"""NVIDIA's management library (``nvidia-ml-py``)."""
AMDSMI = Library("amdsmi", "amdsmi_init", "amdsmi_shut_down", "amdsmi", "AmdSmiException")
"""AMD's management library."""


def query_library(
    library: Library,
    what: str,
    query: Callable[[Any], T],
    *,
    quiet: bool = False,
    fallback: str = "other sources",
) -> T | None:
    """Open ``library``, return ``query(module)``, close it again.

    None when the library is not installed, cannot be initialised, or reports
    an error of its own (logged at debug level: these libraries fail for
    reasons the caller cannot fix, and every query has a ``fallback``, named in
    the log). Any other
    exception is a bug in the bindings and propagates, unless ``quiet``. The
    libraries talk to the kernel driver, never to the CUDA/HIP runtime.
    """
    try:
        module = importlib.import_module(library.module)
    except ImportError:
        logger.debug("%s is not installed; %s from %s", library.label, what, fallback)
        return None
    own_error: type[BaseException] = getattr(module, library.error, Exception)
    caught: type[BaseException] = Exception if quiet else own_error
    try:
        getattr(module, library.init)()
    except caught as exc:
        logger.debug("%s unavailable (%s); using %s", library.label, exc, fallback)
        return None
    try:
        return query(module)
    except caught as exc:
        logger.debug(
            "%s: %s failed (%s: %s); using %s",
            library.label,
            what,
            type(exc).__name__,
            exc,
            fallback,
        )
        return None
    finally:
        try:
            getattr(module, library.shutdown)()
        except caught as exc:
            logger.debug("%s: %s failed: %s", library.label, library.shutdown, exc)
