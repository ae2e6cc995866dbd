"""Building and loading hwplug's native CPU kernels (``csrc/*.c``).

Some CPU work has no good torch op: decode attention that follows a block
table (:mod:`hwplug.kernels.cpu_decode`) and few-row linears read straight
from a 32- or 16-bit weight (:mod:`hwplug.kernels.cpu_linear`). Their C
sources (and the headers they share: ``simd.h``, the vector width, and
``bfloat16.h``, its conversions) ship in the wheel and are compiled together,
on first use, into one shared library with the system's C compiler (``$CC``,
else ``cc``, ``gcc`` or ``clang``; ``-O3 -march=native`` and OpenMP when the
compiler has them), cached under a key of the sources, the compiler, its
flags and the CPU, and loaded with :mod:`ctypes`. A later process loads the
built library.

**The cache** is ``$XDG_CACHE_HOME/hwplug/kernels`` (default
``~/.cache/hwplug/kernels``), else ``$TMPDIR/hwplug-kernels-<uid>``. A
directory is used only when it is private: a real directory (no symbolic
link), created ``0700``, owned by this user, that neither its group nor others
can write, below directories owned by this user or root that others cannot
write unless they are sticky (``/tmp``). One that is not is refused with a
warning saying why, and the next is tried; when none is, the library is built
into a fresh private temporary directory for this process alone: a planted
directory costs a build, never the kernels.

Beside each library ``hwplug_cpu-<key>.so`` a manifest ``hwplug_cpu-<key>.json``
records the SHA-256 of its bytes and the command that built it. The library is
loaded only when both are regular files owned by this user that no one else
can write and the digest matches; otherwise (a file truncated, planted or left
by another build), or when it loads without hwplug's functions or with other
versions of them, it is rebuilt: compiled to a temporary name in the same
directory, renamed over the old file, its manifest written after it, under a
lock (``hwplug_cpu-<key>.lock``) so that processes starting at once (the ranks
of one engine) build it once.

**When there is no library**, :func:`library` returns the reason and every
caller takes its torch path (:func:`unavailable_reason`):

- ``HWPLUG_NATIVE_KERNELS=0`` (:data:`ENV`), read at each call before
  anything is built: no compiler runs;
- no compiler, a ``$CC`` that does not parse, a compiler that fails with every
  flag set, or a build that runs past ``HWPLUG_NATIVE_BUILD_TIMEOUT`` seconds
  (:data:`TIMEOUT_ENV`, default 120, for the whole build: the compiler's
  process group is killed and nothing more is tried). Each is logged once, as
  a warning; none raises from a linear or an attention call.

**A sanitizer build**: ``HWPLUG_NATIVE_SANITIZE=1`` (:data:`SANITIZE_ENV`)
builds with :data:`SANITIZE_FLAGS` (AddressSanitizer and UndefinedBehavior
Sanitizer, cached under a key of their own). The process must have the
compiler's ASan runtime loaded first (``LD_PRELOAD``, as ``make
test-sanitize`` sets it); without it that is the reason. :func:`build_flags`
says which flags the loaded library was built with.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import json
import logging
import math
import os
import platform
import shlex
import shutil
import signal
import stat
import subprocess
import sysconfig
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import torch

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "DOOR_ENV",
    "ENV",
    "SANITIZE_ENV",
    "SANITIZE_FLAGS",
    "TIMEOUT_ENV",
    "build_flags",
    "door_closed_reason",
    "door_library",
    "library",
    "runs",
    "unavailable_reason",
]

log = logging.getLogger(__name__)

ENV = "HWPLUG_NATIVE_KERNELS"
"""``0`` turns every native kernel off (its callers take their torch paths)."""
TIMEOUT_ENV = "HWPLUG_NATIVE_BUILD_TIMEOUT"
"""Seconds the whole build may take, every compiler and flag set tried included."""
DEFAULT_TIMEOUT_S = 120.0
"""The build's time limit where :data:`TIMEOUT_ENV` is not set."""
DOOR_ENV = "HWPLUG_NATIVE_DOOR"
"""``0`` keeps the ops' C++ door closed: every native op call is checked in Python."""
SANITIZE_ENV = "HWPLUG_NATIVE_SANITIZE"
"""``1`` builds the library with :data:`SANITIZE_FLAGS` instead of ``-O3``."""
SANITIZE_FLAGS = (
    "-O1",
    "-g",
    "-fno-omit-frame-pointer",
    "-fsanitize=address,undefined",
    "-fno-sanitize-recover=all",
)
"""The sanitizer build's flags (before ``-march=native`` and ``-fopenmp``)."""

_SOURCES = Path(__file__).with_name("csrc")
_NAME = "hwplug_cpu"
_INTERFACES = {
    "hwplug_paged_decode_version": 4,
    "hwplug_linear_version": 4,
    "hwplug_linear_amx_version": 2,
    "hwplug_linear_dpbf16_version": 1,
}
"""The version function of each source and the version this Python side speaks."""

_OPTIONAL_FLAGS = (("-march=native", "-fopenmp"), ("-fopenmp",), ("-march=native",), ())
"""Tried in order after the optimisation flags: a compiler without OpenMP, or without
``-march=native``, still builds."""


class _Language(NamedTuple):
    """How a library's sources are compiled: arguments before and after them, and the
    version function of each interface the library must have."""

    before: tuple[str, ...]
    after: tuple[str, ...]
    interfaces: dict[str, int]


_C = _Language(("-std=c11",), ("-lm",), _INTERFACES)
"""The C kernels (``csrc/*.c``)."""


class _Build(NamedTuple):
    library: ctypes.CDLL | str
    flags: tuple[str, ...] | None = None


class _TimedOut(Exception):
    """The build ran past its time limit; the message says what was running."""


def library() -> ctypes.CDLL | str:
    """The loaded library of every native kernel, or why there is none.

    ``HWPLUG_NATIVE_KERNELS=0`` is read first, at each call: it is the reason, and
    nothing is built. Otherwise the library is found or built once per process, and a
    failure (logged once) is the reason of every later call; this never raises.
    """
    if os.environ.get(ENV, "").strip() == "0":
        return f"{ENV}=0 is set"
    return _built().library


def door_library() -> ctypes.CDLL | str:
    """The loaded C++ door of the native ops (``csrc/op_door.cpp``, built with torch's
    headers by the C++ compiler: ``$CXX``, else ``c++``, ``g++`` or ``clang++``), or
    why there is none: ``HWPLUG_NATIVE_KERNELS=0`` or ``HWPLUG_NATIVE_DOOR=0``
    (:data:`DOOR_ENV`), read first at each call, or a build that failed (logged once).
    Loading it registers its kernels with torch's dispatcher; it is cached, checked and
    locked as the C kernels are. Never raises."""
    closed = door_closed_reason()
    if closed is not None:
        return closed
    return _door_built().library


def door_closed_reason() -> str | None:
    """The switch that closes the ops' C++ door now (``HWPLUG_NATIVE_KERNELS=0`` or
    ``HWPLUG_NATIVE_DOOR=0``, read at each call), or None. The door itself reads the
    same two variables at each of its calls."""
    for variable in (ENV, DOOR_ENV):
        if os.environ.get(variable, "").strip() == "0":
            return f"{variable}=0 is set"
    return None


def build_flags() -> tuple[str, ...] | None:
    """The compiler flags the library :func:`library` gives was built with (after the
    compiler's name), or None where there is none; builds it as :func:`library` does."""
    if isinstance(library(), str):
        return None
    return _built().flags


def unavailable_reason(
    device: torch.device | str = "cpu",
    kernel: str = "",
    loaded: Callable[[], object] | None = None,
) -> str | None:
    """Why a native kernel cannot run on ``device``'s tensors, or None when it can
    (building the library at the first call that can: three to ten seconds, once per
    machine). ``loaded`` gives the kernel's library, or a string saying why it has none
    (default: :func:`library`)."""
    import torch  # (lazy: the build machinery itself needs no torch)

    kind = torch.device(device).type
    if kind != "cpu":
        return f"the native {kernel or 'CPU'} kernel runs on CPU tensors, not {kind}"
    if os.environ.get(ENV, "").strip() == "0":
        return f"{ENV}=0 is set"
    built = (loaded or library)()
    return built if isinstance(built, str) else None


def runs(loaded: Callable[[], object] | None = None) -> bool:
    """Whether the kernel ``loaded`` gives (default: the library) runs on CPU tensors now:
    :func:`unavailable_reason` is None, checked without building a message (hot paths)."""
    return os.environ.get(ENV, "").strip() != "0" and not isinstance((loaded or library)(), str)


@functools.cache
def _built() -> _Build:
    built = _build(_KERNELS)
    if isinstance(built.library, str):
        log.warning(
            "%s; CPU attention gathers pages instead, and linears run on oneDNN or torch",
            built.library,
        )
    return built


@functools.cache
def _door_built() -> _Build:
    built = _build(_DOOR)
    if isinstance(built.library, str):
        log.warning("%s; the native ops check every call in Python", built.library)
    return built


def _door_language() -> _Language:
    """How the C++ door compiles: against this torch's headers and libraries (their
    paths, its version and its C++ ABI are in the cache key), and Python's headers where
    they are (the attention door reads a context variable through Python's C API)."""
    import torch

    root = Path(torch.__file__).resolve().parent
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    before: tuple[str, ...] = (
        "-std=c++17",
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        f'-DHWPLUG_TORCH_VERSION="{torch.__version__}"',
        "-isystem",
        str(root / "include"),
    )
    python = Path(sysconfig.get_paths()["include"])
    if (python / "Python.h").is_file():  # (without it the attention door is built empty)
        before += ("-isystem", str(python))
    lib = root / "lib"
    after = (f"-L{lib}", "-ltorch_cpu", "-lc10", f"-Wl,-rpath,{lib}")
    return _Language(before, after, {"hwplug_op_door_version": _DOOR_VERSION})


class _Target(NamedTuple):
    """One library built from ``csrc/``: the C kernels, or the ops' C++ door."""

    name: str
    """The stem of its files in the cache."""
    kind: str
    """Its language, as messages name it."""
    language: Callable[[], _Language]
    """How its sources compile (asked when it is built)."""
    compiler_variable: str
    compiler_names: tuple[str, ...]
    sources: str
    """The glob of its sources in ``csrc/``."""
    optimize: tuple[str, ...]
    optional_flags: tuple[tuple[str, ...], ...]
    sanitize_extra: tuple[str, ...] = ()


_KERNELS = _Target(
    "hwplug_cpu", "C", lambda: _C, "CC", ("cc", "gcc", "clang"), "*.c", ("-O3",), _OPTIONAL_FLAGS
)
_DOOR = _Target(
    "hwplug_door",
    "C++",
    _door_language,
    "CXX",
    ("c++", "g++", "clang++"),
    "*.cpp",
    ("-O2",),
    ((),),
    # (UBSan's vptr check needs type information of torch's classes it may not have)
    sanitize_extra=("-fno-sanitize=vptr",),
)
_DOOR_VERSION = 3
"""The version of ``hwplug_op_door_version`` this Python side speaks."""


def _build(target: _Target) -> _Build:
    """The library found in the cache or built into it, with its flags, or why there is
    none."""
    sanitize = os.environ.get(SANITIZE_ENV, "").strip() not in ("", "0")
    # an ASan library loaded into a process without its runtime ends the process
    if sanitize and not hasattr(ctypes.CDLL(None), "__asan_init"):
        return _Build(
            f"{SANITIZE_ENV}=1 needs the compiler's AddressSanitizer runtime loaded first: "
            "LD_PRELOAD=$(cc -print-file-name=libasan.so) (make test-sanitize sets it)"
        )
    variable, kind = target.compiler_variable, target.kind
    named = os.environ.get(variable, "").strip()
    try:
        compilers = [shlex.split(named)] if named else _found_compilers(target.compiler_names)
    except ValueError as error:
        return _Build(
            f"{variable}={named!r} does not parse: {error} (the native CPU kernels need a "
            f"{kind} compiler)"
        )
    if not compilers:
        names = ", ".join(target.compiler_names[:-1]) + f" or {target.compiler_names[-1]}"
        return _Build(f"no {kind} compiler found (set {variable}, or install {names})")
    timeout = _timeout()
    if isinstance(timeout, str):
        return _Build(timeout)
    deadline = time.monotonic() + timeout
    try:
        how = target.language()
        sources = sorted(_SOURCES.glob(target.sources))
        # the key covers the headers the sources include too, and how they compile
        keyed = sources + sorted(_SOURCES.glob("*.h"))
        text = b"\0".join(s.name.encode() + b"\0" + s.read_bytes() for s in keyed)
        text += b"\0" + " ".join((*how.before, *how.after)).encode()
        build = functools.partial(
            _build_in,
            compilers=compilers,
            sources=sources,
            text=text,
            target=target,
            language=how,
        )
        flags = SANITIZE_FLAGS + target.sanitize_extra if sanitize else target.optimize
        directory = _cache_directory()
        if directory is not None:
            return build(directory, flags, deadline)
        with tempfile.TemporaryDirectory(
            prefix="hwplug-kernels-", ignore_cleanup_errors=True
        ) as scratch:
            why = _private_directory(Path(scratch))
            if why is not None:
                return _Build(
                    f"the native CPU kernels have no private directory to build in: {why}"
                )
            log.warning("building the native CPU kernels in %s, for this process alone", scratch)
            # (removed once loaded: the process keeps its mapping)
            return build(Path(scratch), flags, deadline)
    except _TimedOut as error:
        return _Build(
            f"the native CPU kernels did not build: timed out after {timeout:g} s "
            f"({TIMEOUT_ENV}={os.environ.get(TIMEOUT_ENV, '').strip() or 'unset'}) {error}"
        )
    except OSError as error:  # (the sources, or the temporary directory)
        return _Build(f"the native CPU kernels did not build: {error}")


def _build_in(
    directory: Path,
    base_flags: tuple[str, ...],
    deadline: float,
    *,
    compilers: list[list[str]],
    sources: list[Path],
    text: bytes,
    target: _Target,
    language: _Language,
) -> _Build:
    """The first compiler and flag set whose library loads from ``directory`` (built there
    if it must be), or the last problem. ``text`` is what the sources' key covers."""
    problems = []
    for compiler in compilers:
        for optional in target.optional_flags:
            flags = base_flags + optional
            command = [*compiler, *flags]
            key = hashlib.sha256(
                b"\0".join([text, " ".join(command).encode(), _cpu_identity().encode()])
            ).hexdigest()[:20]
            try:
                loaded = _cached_or_built(
                    directory / f"{target.name}-{key}", command, sources, deadline, language
                )
            except (OSError, subprocess.SubprocessError) as error:
                problems.append(f"{' '.join(command)}: {error}")
                continue
            if isinstance(loaded, str):
                problems.append(loaded)
                continue
            log.debug("native CPU kernels: %s (%s)", loaded._name, " ".join(flags))
            return _Build(loaded, flags)
    return _Build("the native CPU kernels did not build: " + problems[-1])


def _found_compilers(names: tuple[str, ...] = ("cc", "gcc", "clang")) -> list[list[str]]:
    found = []
    for name in names:
        path = shutil.which(name)
        if path is not None:
            found.append([path])
    return found


def _timeout() -> float | str:
    """The build's time limit in seconds, or why :data:`TIMEOUT_ENV` is not one."""
    text = os.environ.get(TIMEOUT_ENV, "").strip()
    if not text:
        return DEFAULT_TIMEOUT_S
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        return (
            f"{TIMEOUT_ENV}={text!r} is not a number of seconds above 0 "
            f"(unset: {DEFAULT_TIMEOUT_S:g})"
        )
    return seconds


def _cpu_identity() -> str:
    """What ``-march=native`` depends on: the CPU's model and flags (Linux), else its name."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return f"{platform.machine()} {platform.processor()}"
    keep = [
        line
        for line in text.splitlines()
        if line.split(":")[0].strip() in ("model name", "flags", "Features", "CPU part")
    ]
    return "\n".join(sorted(set(keep)))


# -- the cache directory ----------------------------------------------------------------------


def _cache_directory() -> Path | None:
    """The first private cache directory (made if missing), or None; each one refused is
    logged with the reason."""
    candidates = []
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):  # (the XDG spec: a relative path is ignored)
        with contextlib.suppress(RuntimeError):
            base = str(Path.home() / ".cache")
    if os.path.isabs(base):
        candidates.append(Path(base) / "hwplug" / "kernels")
    with contextlib.suppress(OSError):  # (no usable temporary directory)
        candidates.append(Path(tempfile.gettempdir()) / f"hwplug-kernels-{os.getuid()}")
    for candidate in candidates:
        why = _private_directory(candidate)
        if why is None:
            return candidate
        log.warning("the native CPU kernels' cache: not using %s: %s", candidate, why)
    return None


def _private_directory(path: Path) -> str | None:
    """None when ``path`` is a directory only this user can change (made ``0700``, with
    its missing parents, if it is missing), else why it is refused."""
    try:
        missing = [p for p in (path, *path.parents) if not os.path.lexists(p)]
        for new in reversed(missing):
            with contextlib.suppress(FileExistsError):
                new.mkdir(mode=0o700)
        why = _not_private(os.lstat(path), directory=True)
        if why is not None:
            return why
        resolved = Path(os.path.realpath(path.parent))
        for parent in (resolved, *resolved.parents):
            info = os.stat(parent)
            if info.st_uid not in (0, os.getuid()):
                return f"{parent} above it is owned by uid {info.st_uid}"
            if info.st_mode & stat.S_IWOTH and not info.st_mode & stat.S_ISVTX:
                return f"others can write {parent} above it, which is not sticky"
    except OSError as error:
        return f"it cannot be made or checked ({error})"
    if not os.access(path, os.W_OK | os.X_OK):
        return "this user cannot write it"
    return None


def _not_private(info: os.stat_result, *, directory: bool) -> str | None:
    """Why a file or directory (its ``lstat``) is not this user's alone, or None."""
    if stat.S_ISLNK(info.st_mode):
        return "it is a symbolic link"
    if not (stat.S_ISDIR if directory else stat.S_ISREG)(info.st_mode):
        return "it is not a directory" if directory else "it is not a regular file"
    if info.st_uid != os.getuid():
        return f"it is owned by uid {info.st_uid}, not this user ({os.getuid()})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"its group or others can write it (mode {stat.S_IMODE(info.st_mode):04o})"
    return None


# -- one library: checked, loaded, rebuilt ------------------------------------------------------


def _cached_or_built(
    stem: Path,
    command: list[str],
    sources: list[Path],
    deadline: float,
    language: _Language,
) -> ctypes.CDLL | str:
    """The library ``stem.so`` loaded if its checks pass, else rebuilt and loaded (or why
    it does not load). ``language``: how its sources are compiled and which interface
    versions it must have."""
    target, manifest = Path(f"{stem}.so"), Path(f"{stem}.json")
    why = _unfit(target, manifest)
    tried = why is None  # (a file that passed its checks and did not load is rebuilt)
    if tried:
        loaded = _opened(target, language.interfaces)
        if not isinstance(loaded, str):
            return loaded
        why = loaded
    with _locked(Path(f"{stem}.lock"), deadline):
        # another process may have built it while this one waited
        if not tried and _unfit(target, manifest) is None:
            loaded = _opened(target, language.interfaces)
            if not isinstance(loaded, str):
                return loaded
            why = loaded
        if os.path.lexists(target):
            log.warning("rebuilding the native CPU kernels' %s: %s", target, why)
        _compile(command, sources, target, manifest, deadline, language)
        log.info("built the native CPU kernels: %s", target)
    return _opened(target, language.interfaces)


def _unfit(target: Path, manifest: Path) -> str | None:
    """Why ``target`` may not be loaded (or None): it and its manifest must be regular
    files this user alone can write, and its bytes must have the manifest's digest."""
    for path in (target, manifest):
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            return f"{path.name} is missing"
        why = _not_private(info, directory=False)
        if why is not None:
            return f"{path.name}: {why}"
    try:
        recorded = json.loads(manifest.read_text())["sha256"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        return f"{manifest.name} holds no digest ({error!r})"
    if _sha256(target) != recorded:
        return f"{target.name} does not have the digest recorded in {manifest.name}"
    return None


def _opened(path: Path, interfaces: dict[str, int]) -> ctypes.CDLL | str:
    """The library at ``path`` loaded, with every interface version this side speaks
    (``interfaces``: each version function's name and version), or why not (a library
    loaded without them is unloaded again)."""
    try:
        loaded = ctypes.CDLL(str(path))
    except OSError as error:
        return f"{path} does not load ({error})"
    try:
        stale = [name for name, v in interfaces.items() if getattr(loaded, name)() != v]
    except AttributeError as error:
        stale = [str(error)]
    if not stale:
        return loaded
    # unloaded, so that loading the path again after a rebuild opens the new file (the
    # loader hands back a library of the same name that is still open)
    import _ctypes

    with contextlib.suppress(OSError):
        _ctypes.dlclose(loaded._handle)
    return f"{path} lacks hwplug's functions of this version ({', '.join(stale)})"


@contextlib.contextmanager
def _locked(path: Path, deadline: float) -> Iterator[None]:
    """Holds an exclusive lock on ``path`` (waiting at most until ``deadline``)."""
    import fcntl  # (POSIX only, as the rest of the build)

    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise _TimedOut(f"waiting for another process to build {path}") from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # (releases the lock)


def _compile(
    command: list[str],
    sources: list[Path],
    target: Path,
    manifest: Path,
    deadline: float,
    language: _Language,
) -> None:
    """Builds ``target`` under a temporary name beside it, renames it into place, then
    writes its manifest the same way: no process ever sees half a file."""
    fd, partial = tempfile.mkstemp(dir=target.parent, prefix=f".{_NAME}-", suffix=".so")
    os.close(fd)
    try:
        _run(
            [
                *command,
                "-shared",
                "-fPIC",
                *language.before,
                *map(str, sources),
                "-o",
                partial,
                *language.after,
            ],
            deadline,
        )
        # (the linker makes the file with the umask's mode)
        os.chmod(partial, 0o700)
        record = {"sha256": _sha256(Path(partial)), "command": command}
        os.replace(partial, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(partial)
    fd, partial = tempfile.mkstemp(dir=target.parent, prefix=f".{_NAME}-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as file:
            json.dump(record, file)
        os.replace(partial, manifest)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(partial)


def _run(command: list[str], deadline: float) -> None:
    """Runs the compiler in a process group of its own, killed whole at ``deadline``."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise _TimedOut(f"before {command[0]} could start")
    with subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        start_new_session=True,
    ) as process:
        try:
            _, errors = process.communicate(timeout=remaining)
        except subprocess.TimeoutExpired:
            raise _TimedOut(f"running {shlex.join(command[:8])} ...") from None
        finally:
            if process.returncode is None:
                # the compiler's own children (cc1, as, ld) hold its pipe open too
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    if process.returncode != 0:
        last = (errors.strip().splitlines() or ["(no message)"])[-1]
        raise subprocess.SubprocessError(f"exit status {process.returncode}: {last}")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(functools.partial(file.read, 1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
