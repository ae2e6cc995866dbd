"""The native kernels' build cache (:mod:`hwplug.kernels.native`): a private directory,
every library checked before it is loaded and rebuilt when it is bad, and every build
failure a reason the torch paths run with, never an exception from a linear or an
attention call.

Each risky case runs in its own Python process (a library that crashes the loader fails
one test, not the session). Most of them build with a stand-in compiler (``fake_cc``)
that copies a library the real compiler built once for the session, so a rebuild costs
a copy instead of seconds, and that logs every call.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from hwplug.kernels import native

REPO = Path(__file__).resolve().parents[2]
UID = os.getuid()
ROOT_ONLY = pytest.mark.skipif(UID != 0, reason="only root can give a file to another user")
OTHER_UID = 12345

# What every case checks: a linear and a decode attention step give the right values,
# and what the kernels report.
PROBE = r"""
import json, torch
import hwplug.kernels as kernels
from hwplug.attention import TorchAttentionBackend
from hwplug.kernels import native
from tests.attention.helpers import make_batch, reference_attention

torch.manual_seed(0)
x, w = torch.randn(3, 64), torch.randn(40, 64)
product = kernels.linear(x, w, backend="native")
batch = make_batch([9, 6], [1, 1], num_heads=4, num_kv_heads=2, head_size=16, block_size=4)
attended = TorchAttentionBackend(4, 16, 2, 0.25, cache_dtype=torch.float32).forward(*batch.args())
want = reference_attention(
    batch.query, batch.key_cache, batch.value_cache, batch.metadata, scale=0.25
).float()
loaded = native.library()
print(json.dumps({
    "linear_ok": torch.allclose(product, x @ w.T, atol=1e-4, rtol=1e-4),
    "attention_ok": torch.allclose(attended.reshape(want.shape), want, atol=1e-4, rtol=1e-4),
    "lanes": kernels.native_linear_lanes(),
    "linear_reason": kernels.native_linear_unavailable_reason(),
    "decode_reason": kernels.native_decode_unavailable_reason(),
    "library": loaded if isinstance(loaded, str) else loaded._name,
}))
"""

LOAD_ONLY = r"""
import json
from hwplug.kernels import native
loaded = native.library()
print(json.dumps({"library": loaded if isinstance(loaded, str) else loaded._name}))
"""


@dataclasses.dataclass
class Run:
    """A probe's process: its exit status, output and what it printed (None if nothing)."""

    returncode: int
    stdout: str
    stderr: str
    seconds: float
    report: dict[str, Any] | None


def _env(tmp_path: Path, **overrides: str | None) -> dict[str, str]:
    """The environment of a probe: this one's (sanitizer settings included), with the
    caches under ``tmp_path`` and no native-kernel settings but ``overrides``."""
    env = dict(os.environ)
    for name in ("HWPLUG_NATIVE_KERNELS", "HWPLUG_NATIVE_BUILD_TIMEOUT", "CC"):
        env.pop(name, None)
    (tmp_path / "tmp").mkdir(exist_ok=True)
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    env["TMPDIR"] = str(tmp_path / "tmp")
    for name, value in overrides.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def _probe(env: dict[str, str], code: str = PROBE, timeout: float = 120) -> Run:
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = done.stdout.strip().splitlines()
    report = json.loads(lines[-1]) if done.returncode == 0 and lines else None
    return Run(done.returncode, done.stdout, done.stderr, time.monotonic() - start, report)


def _works(run: Run, lanes: int) -> None:
    """The probe exited cleanly, and linears and attention ran with the native kernels."""
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.report is not None
    assert run.report["linear_ok"] and run.report["attention_ok"]
    assert run.report["lanes"] == lanes, run.stderr[-3000:]
    if lanes:
        assert run.report["linear_reason"] is None


def _compile(tmp_path: Path, name: str, source: str, *flags: str) -> Path:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler")
    (tmp_path / f"{name}.c").write_text(source)
    out = tmp_path / f"{name}.so"
    command = [compiler, *flags, "-shared", "-fPIC", str(tmp_path / f"{name}.c"), "-o", str(out)]
    subprocess.run(command, check=True, capture_output=True)
    return out


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _libraries(directory: Path) -> list[Path]:
    return sorted(directory.glob("hwplug_cpu-*.so"))


@dataclasses.dataclass
class Golden:
    """The library the real compiler built for this session, and its vector lanes."""

    path: Path
    lanes: int


@pytest.fixture(scope="session")
def golden(tmp_path_factory: pytest.TempPathFactory) -> Golden:
    home = tmp_path_factory.mktemp("golden")
    run = _probe(_env(home), PROBE, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.report is not None
    if not run.report["library"].endswith(".so"):
        pytest.skip(f"the native kernels do not build here: {run.report['library']}")
    kept = home / "golden.so"
    shutil.copyfile(run.report["library"], kept)
    return Golden(kept, run.report["lanes"])


@dataclasses.dataclass
class FakeCC:
    """A compiler that copies the golden library for a ``-march=native`` build (and runs
    the real compiler for any other), logging each call's arguments to ``log`` (one per
    test). ``seeded`` is a cache it filled once for the session."""

    path: Path
    log: Path
    seeded: Path

    def env(self, tmp_path: Path, **overrides: str | None) -> dict[str, str]:
        """A probe's environment (:func:`_env`) with this compiler as ``$CC``."""
        return _env(tmp_path, CC=str(self.path), FAKE_CC_LOG=str(self.log), **overrides)

    def calls(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []

    def seed(self, tmp_path: Path) -> Path:
        """The session's cache copied to ``tmp_path``'s: its library's path there."""
        cache = tmp_path / "cache" / "hwplug" / "kernels"
        shutil.copytree(self.seeded, cache)
        (library,) = _libraries(cache)
        return library


@pytest.fixture(scope="session")
def fake_compiler(tmp_path_factory: pytest.TempPathFactory, golden: Golden) -> tuple[Path, Path]:
    """The stand-in compiler's script, and the cache it filled (both for the session)."""
    home = tmp_path_factory.mktemp("fake-cc")
    real = shutil.which("cc") or shutil.which("gcc")
    script = home / "fake-cc"
    script.write_text(
        "#!/bin/sh\n"
        'echo "$*" >> "${FAKE_CC_LOG:-/dev/null}"\n'
        "out=; prev=\n"
        'for arg in "$@"; do [ "$prev" = -o ] && out=$arg; prev=$arg; done\n'
        "sleep ${FAKE_CC_SLEEP:-0}\n"
        f'case " $* " in *" -march=native "*) exec cp "{golden.path}" "$out";; esac\n'
        f'exec "{real}" "$@"\n'
    )
    script.chmod(0o755)
    run = _probe(_env(home, CC=str(script)), LOAD_ONLY)
    assert run.returncode == 0, run.stderr[-3000:]
    return script, home / "cache" / "hwplug" / "kernels"


@pytest.fixture
def fake_cc(tmp_path: Path, fake_compiler: tuple[Path, Path]) -> FakeCC:
    script, seeded = fake_compiler
    return FakeCC(script, tmp_path / "fake-cc.log", seeded)


PLANTED_SOURCE = r"""
#include <stdio.h>
__attribute__((constructor)) static void planted(void) {
    FILE *f = fopen(MARKER, "w");
    if (f) { fputs("planted code ran", f); fclose(f); }
}
int hwplug_linear_version(void) { return 2; }
"""


@pytest.fixture
def planted(tmp_path: Path) -> tuple[Path, Path]:
    """A library whose constructor writes a marker file: (the library, the marker)."""
    marker = tmp_path / "PLANTED-CODE-RAN"
    library = _compile(tmp_path, "planted", PLANTED_SOURCE, f'-DMARKER="{marker}"')
    return library, marker


def _plant(library: Path, directory: Path, name: str) -> None:
    """Put ``library`` at ``directory/name`` with a digest beside it that matches it, as
    an attacker who knows the cache's layout would."""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(library, directory / name)
    manifest = {"sha256": _sha256(library), "command": ["cc"]}
    (directory / name).with_suffix(".json").write_text(json.dumps(manifest))


# -- item 8: nobody else's directory or file is ever loaded from -----------------------------


def _shared_tmp_dir(tmp_path: Path) -> Path:
    return tmp_path / "tmp" / f"hwplug-kernels-{UID}"


@pytest.mark.parametrize(
    "planting", [pytest.param("other-owner", marks=ROOT_ONLY), "world-writable", "symlink"]
)
def test_a_library_planted_in_the_shared_temporary_directory_is_never_loaded(
    tmp_path: Path, golden: Golden, fake_cc: FakeCC, planted: tuple[Path, Path], planting: str
) -> None:
    library, marker = planted
    (seeded,) = _libraries(fake_cc.seeded)
    name = seeded.name
    shared = _shared_tmp_dir(tmp_path)
    if planting == "symlink":
        _plant(library, tmp_path / "elsewhere", name)
        shared.parent.mkdir(parents=True, exist_ok=True)
        shared.symlink_to(tmp_path / "elsewhere")
    else:
        _plant(library, shared, name)
    if planting == "other-owner":
        for path in (shared, *shared.iterdir()):
            os.chown(path, OTHER_UID, OTHER_UID)
    if planting == "world-writable":
        shared.chmod(0o777)
    unusable = tmp_path / "not-a-directory"
    unusable.write_text("")
    # the user's cache cannot be made: the shared temporary directory is next
    run = _probe(fake_cc.env(tmp_path, XDG_CACHE_HOME=str(unusable)))
    assert not marker.exists(), "the planted library was loaded"
    _works(run, golden.lanes)
    loaded = Path(run.report["library"]).resolve()
    assert not loaded.is_relative_to(shared.resolve())
    assert str(shared) in run.stderr  # the refusal says which directory and why


def test_a_cache_directory_others_can_write_is_refused_and_the_next_one_is_used(
    tmp_path: Path, golden: Golden, fake_cc: FakeCC, planted: tuple[Path, Path]
) -> None:
    library, marker = planted
    (seeded,) = _libraries(fake_cc.seeded)
    name = seeded.name
    cache = tmp_path / "cache" / "hwplug" / "kernels"
    _plant(library, cache, name)
    cache.chmod(0o777)
    run = _probe(fake_cc.env(tmp_path))
    assert not marker.exists(), "the planted library was loaded"
    _works(run, golden.lanes)
    shared = _shared_tmp_dir(tmp_path)
    assert Path(run.report["library"]).parent == shared
    assert stat.S_IMODE(shared.stat().st_mode) == 0o700
    assert str(cache) in run.stderr


@ROOT_ONLY
def test_a_library_in_the_cache_owned_by_another_user_is_rebuilt_not_loaded(
    tmp_path: Path, golden: Golden, fake_cc: FakeCC, planted: tuple[Path, Path]
) -> None:
    library, marker = planted
    cached = fake_cc.seed(tmp_path)
    _plant(library, cached.parent, cached.name)
    os.chown(cached, OTHER_UID, OTHER_UID)
    run = _probe(fake_cc.env(tmp_path))
    assert not marker.exists(), "the planted library was loaded"
    _works(run, golden.lanes)
    assert len(fake_cc.calls()) == 1  # rebuilt
    assert cached.stat().st_uid == UID


def test_the_cache_is_private_and_keeps_a_digest_of_each_library(
    tmp_path: Path, golden: Golden, fake_cc: FakeCC
) -> None:
    run = _probe(fake_cc.env(tmp_path), LOAD_ONLY)
    assert run.returncode == 0, run.stderr[-3000:]
    cache = tmp_path / "cache" / "hwplug" / "kernels"
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    (cached,) = _libraries(cache)
    manifest = json.loads(cached.with_suffix(".json").read_text())
    assert manifest["sha256"] == _sha256(cached)
    assert "-march=native" in manifest["command"]
    assert sorted(p.name for p in cache.iterdir() if not p.name.endswith(".lock")) == sorted(
        [cached.name, cached.with_suffix(".json").name]
    )  # no temporary file left behind


# -- items 9 and 10: a damaged library is rebuilt, never loaded ------------------------------


@pytest.mark.parametrize("size", [0, 16, 1024, 100_000])
def test_a_truncated_library_is_rebuilt_with_the_same_flags_not_loaded(
    tmp_path: Path, golden: Golden, fake_cc: FakeCC, size: int
) -> None:
    cached = fake_cc.seed(tmp_path)
    with cached.open("r+b") as file:
        file.truncate(size)
    run = _probe(fake_cc.env(tmp_path))
    _works(run, golden.lanes)
    (rebuilt,) = fake_cc.calls()
    assert "-march=native" in rebuilt.split()
    assert _sha256(cached) == _sha256(golden.path)


# -- item 11: a library without hwplug's symbols --------------------------------------------


@pytest.mark.parametrize("digest", ["stale", "forged"])
def test_a_library_without_hwplugs_symbols_at_the_cache_path_is_rebuilt(
    tmp_path: Path, golden: Golden, fake_cc: FakeCC, digest: str
) -> None:
    stranger = _compile(tmp_path, "stranger", "int unrelated(void) { return 7; }\n")
    cached = fake_cc.seed(tmp_path)
    shutil.copyfile(stranger, cached)
    if digest == "forged":  # the digest matches: only the interface check can tell
        manifest_path = cached.with_suffix(".json")
        manifest = json.loads(manifest_path.read_text())
        manifest["sha256"] = _sha256(stranger)
        manifest_path.write_text(json.dumps(manifest))
    run = _probe(fake_cc.env(tmp_path))
    _works(run, golden.lanes)
    assert len(fake_cc.calls()) == 1
    assert _sha256(cached) == _sha256(golden.path)
    # and the next process loads it as it is
    again = _probe(fake_cc.env(tmp_path), LOAD_ONLY)
    assert again.returncode == 0 and len(fake_cc.calls()) == 1


# -- item 12: a compiler that cannot run is a reason, not an exception -----------------------


@pytest.mark.parametrize(
    ("cc", "says"),
    [('gcc "', "CC='gcc \"' does not parse"), ("false", "exit status 1")],
    ids=["does-not-parse", "fails"],
)
def test_a_compiler_that_cannot_build_is_the_reason_and_torch_runs(
    tmp_path: Path, cc: str, says: str
) -> None:
    run = _probe(_env(tmp_path, CC=cc))
    _works(run, lanes=0)
    for reason in ("linear_reason", "decode_reason", "library"):
        assert says in run.report[reason]
    assert run.stderr.count(says) == 1  # logged once


def test_a_hanging_compiler_is_stopped_at_the_build_timeout_and_torch_runs(
    tmp_path: Path,
) -> None:
    script = tmp_path / "hanging-cc"
    pids = tmp_path / "pids"
    script.write_text(f'#!/bin/sh\nsleep 60 &\necho $! >> "{pids}"\nwait\n')
    script.chmod(0o755)
    run = _probe(_env(tmp_path, CC=str(script), HWPLUG_NATIVE_BUILD_TIMEOUT="2"), timeout=100)
    _works(run, lanes=0)
    assert run.seconds < 40
    assert "timed out after 2" in run.report["linear_reason"]
    assert "HWPLUG_NATIVE_BUILD_TIMEOUT" in run.report["linear_reason"]
    (pid,) = pids.read_text().split()  # one deadline for the whole build: one try
    state = Path(f"/proc/{pid}/stat")
    assert not state.exists() or state.read_text().split()[2] == "Z"  # its children killed


# -- item 13: the kill switch comes before any build -----------------------------------------


def test_the_kill_switch_stops_the_compiler_before_it_runs(tmp_path: Path) -> None:
    script = tmp_path / "recording-cc"
    called = tmp_path / "CC-WAS-CALLED"
    script.write_text(f'#!/bin/sh\ntouch "{called}"\nexit 1\n')
    script.chmod(0o755)
    run = _probe(_env(tmp_path, CC=str(script), HWPLUG_NATIVE_KERNELS="0"))
    _works(run, lanes=0)
    assert not called.exists(), "the compiler ran under HWPLUG_NATIVE_KERNELS=0"
    assert run.report["library"] == run.report["linear_reason"] == "HWPLUG_NATIVE_KERNELS=0 is set"
    assert not (tmp_path / "cache" / "hwplug").exists()


def test_the_kill_switch_is_read_at_each_call(
    tmp_path: Path, golden: Golden, fake_cc: FakeCC
) -> None:
    code = (
        "import os\n"
        "from hwplug.kernels import native\n"
        "off = native.library()\n"
        "del os.environ['HWPLUG_NATIVE_KERNELS']\n"
        "on = native.library()\n"
        "print(repr(off)); print(type(on).__name__)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=fake_cc.env(tmp_path, HWPLUG_NATIVE_KERNELS="0"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["'HWPLUG_NATIVE_KERNELS=0", "is", "set'", "CDLL"]


# -- processes that start at once -------------------------------------------------------------


def test_processes_starting_at_once_build_the_library_once_and_all_load_it(
    tmp_path: Path, golden: Golden, fake_cc: FakeCC
) -> None:
    env = fake_cc.env(tmp_path, FAKE_CC_SLEEP="3")
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", LOAD_ONLY],
            env=env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outputs = [process.communicate(timeout=120) for process in processes]
    for process, (stdout, stderr) in zip(processes, outputs):
        assert process.returncode == 0, stderr[-3000:]
        assert json.loads(stdout)["library"].endswith(".so"), stderr[-3000:]
    assert len(fake_cc.calls()) == 1


# -- the sanitizer build ----------------------------------------------------------------------


def _sanitizer_runtimes() -> list[str]:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler")
    found = []
    for name in ("libasan.so", "libubsan.so"):
        done = subprocess.run(
            [compiler, f"-print-file-name={name}"], capture_output=True, text=True
        )
        path = done.stdout.strip()
        if not os.path.isabs(path):
            pytest.skip(f"the compiler has no {name}")
        found.append(path)
    return found


@pytest.mark.skipif(
    os.environ.get("HWPLUG_NATIVE_SANITIZE", "") != "1", reason="runs under make test-sanitize"
)
def test_the_sanitizer_build_is_what_is_loaded_when_asked_for() -> None:
    loaded = native.library()
    assert not isinstance(loaded, str), loaded
    flags = native.build_flags()
    assert flags is not None and "-fsanitize=address,undefined" in flags
    assert b"__asan_report_" in Path(loaded._name).read_bytes()


def test_the_sanitizer_build_without_its_runtime_preloaded_is_a_reason(tmp_path: Path) -> None:
    env = _env(tmp_path, HWPLUG_NATIVE_SANITIZE="1", LD_PRELOAD=None)
    run = _probe(env)
    _works(run, lanes=0)
    assert "LD_PRELOAD" in run.report["linear_reason"]


def test_the_sanitizer_set_up_catches_an_out_of_bounds_write(tmp_path: Path) -> None:
    runtimes = _sanitizer_runtimes()
    source = (
        "#include <stdlib.h>\n"
        "int overflow(int n) {\n"
        "    volatile int *a = malloc(n * sizeof *a);  /* (volatile: the store stays) */\n"
        "    a[n] = 1;\n"
        "    free((void *)a);\n"
        "    return 0;\n"
        "}\n"
    )
    library = _compile(tmp_path, "overflow", source, *native.SANITIZE_FLAGS)
    env = _env(
        tmp_path,
        LD_PRELOAD=":".join(runtimes),
        ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:halt_on_error=1",
    )
    code = f"import ctypes; ctypes.CDLL({str(library)!r}).overflow(4); print('not caught')"
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0
    assert "not caught" not in done.stdout
    assert "AddressSanitizer: heap-buffer-overflow" in done.stderr
