"""Building and loading hwplug's native CPU kernels (``csrc/*.c``).

Some CPU work has no good torch op: decode attention that follows a block
table (:mod:`hwplug.kernels.cpu_decode`) and few-row linears read straight
from a 32- or 16-bit weight (:mod:`hwplug.kernels.cpu_linear`). Their C
sources (and the headers they share: ``simd.h``, the vector width, and
``bfloat16.h``, its conversions) ship in the wheel and are compiled together,
on first use, into one shared library with the system's C compiler (``$CC``,
else ``cc``, ``gcc`` or ``clang``; ``-O3 -march=native`` and OpenMP when the
compiler has them), cached in ``$XDG_CACHE_HOME/hwplug/kernels`` (default
``~/.cache/hwplug/kernels``; a temporary directory when that is not
writable) under a key of the sources, the compiler, its flags and the CPU,
and loaded with :mod:`ctypes`. A later process loads the built library.

Where it cannot be built (no compiler) or ``HWPLUG_NATIVE_KERNELS=0`` is set
(read at each call), :func:`unavailable_reason` says why and every caller
takes its torch path.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["ENV", "library", "unavailable_reason"]

log = logging.getLogger(__name__)

ENV = "HWPLUG_NATIVE_KERNELS"
"""``0`` turns every native kernel off (its callers take their torch paths)."""

_SOURCES = Path(__file__).with_name("csrc")
_NAME = "hwplug_cpu"
_INTERFACES = {
    "hwplug_paged_decode_version": 4,
    "hwplug_linear_version": 2,
    "hwplug_linear_amx_version": 2,
    "hwplug_linear_dpbf16_version": 1,
}
"""The version function of each source and the version this Python side speaks."""

_FLAG_SETS = (
    ("-O3", "-march=native", "-fopenmp"),
    ("-O3", "-fopenmp"),
    ("-O3", "-march=native"),
    ("-O3",),
)
"""Tried in order: a compiler without OpenMP, or without ``-march=native``, still builds."""


def _compilers() -> list[list[str]]:
    named = os.environ.get("CC", "").strip()
    if named:
        return [shlex.split(named)]
    found = []
    for name in ("cc", "gcc", "clang"):
        path = shutil.which(name)
        if path is not None:
            found.append([path])
    return found


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


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "hwplug" / "kernels"


@functools.cache
def library() -> ctypes.CDLL | str:
    """The loaded library of every native kernel, or why there is none (built once per
    process at most; ``HWPLUG_NATIVE_KERNELS`` is not consulted here)."""
    compilers = _compilers()
    if not compilers:
        return "no C compiler found (set CC, or install cc, gcc or clang)"
    sources = sorted(_SOURCES.glob("*.c"))
    # the key covers the headers the sources include too
    keyed = sources + sorted(_SOURCES.glob("*.h"))
    text = b"\0".join(s.name.encode() + b"\0" + s.read_bytes() for s in keyed)
    problems = []
    for compiler in compilers:
        for flags in _FLAG_SETS:
            key = hashlib.sha256(
                b"\0".join(
                    [text, " ".join(compiler + list(flags)).encode(), _cpu_identity().encode()]
                )
            ).hexdigest()[:20]
            try:
                path = _build(compiler, flags, sources, key)
                loaded = ctypes.CDLL(str(path))
            except (OSError, subprocess.SubprocessError) as error:
                problems.append(f"{' '.join(compiler + list(flags))}: {error}")
                continue
            stale = [name for name, v in _INTERFACES.items() if getattr(loaded, name)() != v]
            if stale:
                problems.append(f"{path}: built from another version of the sources")
                continue
            log.debug("native CPU kernels: %s (%s)", path, " ".join(flags))
            return loaded
    reason = "the native CPU kernels did not build: " + problems[-1]
    log.warning(
        "%s; CPU attention gathers pages instead, and linears run on oneDNN or torch", reason
    )
    return reason


def unavailable_reason(
    device: torch.device | str = "cpu",
    kernel: str = "",
    loaded: Callable[[], object] | None = None,
) -> str | None:
    """Why a native kernel cannot run on ``device``'s tensors, or None when it can
    (building the library at the first call that can: three to five seconds, once per
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


def _build(compiler: list[str], flags: tuple[str, ...], sources: list[Path], key: str) -> Path:
    """The built library for this key: found in the cache, else compiled into it."""
    for directory in (_cache_dir(), Path(tempfile.gettempdir()) / f"hwplug-kernels-{os.getuid()}"):
        target = directory / f"{_NAME}-{key}.so"
        if target.exists():
            return target
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if not os.access(directory, os.W_OK):
            continue
        # compiled beside its final name, then renamed: processes building at once
        # (ranks of one engine) never load a half-written file
        fd, partial = tempfile.mkstemp(dir=directory, prefix=f".{_NAME}-", suffix=".so")
        os.close(fd)
        try:
            command = [*compiler, *flags, "-shared", "-fPIC", "-std=c11"]
            command += [str(s) for s in sources] + ["-o", partial, "-lm"]
            done = subprocess.run(command, capture_output=True, text=True, timeout=300)
            if done.returncode != 0:
                last = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
                raise subprocess.SubprocessError(f"exit status {done.returncode}: {last}")
            os.replace(partial, target)
        finally:
            if os.path.exists(partial):
                os.unlink(partial)
        log.info("built the native CPU kernels: %s", target)
        return target
    raise OSError("no writable directory to build the kernels in")
