"""Release check: build the sdist and the wheel, check their metadata, install the wheel
into a clean virtual environment, import hwplug there, run ``hwplug info`` and build
the native CPU kernels from the installed sources.

``python scripts/release_check.py [--keep DIR]`` (``make release-check``). Exit
status 0 when everything holds; otherwise 1, with one line per problem.
"""

from __future__ import annotations

import argparse
import email
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
TORCH_PIN = "torch==2.13.0"
"""The CPU build the machines here install quickly (pyproject keeps a range)."""


def run(*args: str, cwd: Path | None = None) -> str:
    result = subprocess.run(args, cwd=cwd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-5:]
        raise SystemExit(f"release check: `{' '.join(args)}` failed:\n  " + "\n  ".join(tail))
    return result.stdout


def check_metadata(wheel: Path, sdist: Path, project: dict) -> list[str]:
    """Problems with the built distributions' metadata (none: an empty list)."""
    problems = []
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        meta_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
        meta = email.message_from_string(zf.read(meta_name).decode())
        entry = next((n for n in names if n.endswith(".dist-info/entry_points.txt")), None)
        entry_points = zf.read(entry).decode() if entry else ""
    if meta["Name"] != project["name"]:
        problems.append(f"wheel Name is {meta['Name']!r}, pyproject says {project['name']!r}")
    version = re.search(r'__version__ = "([^"]+)"', (REPO / "src/hwplug/_version.py").read_text())
    if version is None or meta["Version"] != version.group(1):
        problems.append(f"wheel Version is {meta['Version']!r}, src/hwplug/_version.py differs")
    if meta["Requires-Python"] != project["requires-python"]:
        problems.append(f"wheel Requires-Python is {meta['Requires-Python']!r}")
    if not (meta.get_payload() or "").strip():
        problems.append("the wheel has no long description (the README)")
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    def key(text: str) -> tuple[str, str, str]:
        req = Requirement(text)
        return canonicalize_name(req.name), str(req.specifier), str(req.marker or "")

    requires = {key(r) for r in meta.get_all("Requires-Dist") or []}
    for dep in project["dependencies"]:
        if key(dep) not in requires:
            problems.append(f"the wheel does not require {dep!r}")
    for group in ("hwplug.platforms", "pytest11"):
        if f"[{group}]" not in entry_points:
            problems.append(f"the wheel has no [{group}] entry points")
    if "console_scripts" not in entry_points or "hwplug = " not in entry_points:
        problems.append("the wheel does not install the `hwplug` command")
    if any(n.startswith("tests/") for n in names):
        problems.append("the wheel carries the tests")
    if not any(n == "hwplug/py.typed" for n in names):
        problems.append("the wheel lacks hwplug/py.typed (typed package marker)")
    csrc = REPO / "src/hwplug/kernels/csrc"
    for source in sorted([*csrc.glob("*.c"), *csrc.glob("*.cpp"), *csrc.glob("*.h")]):
        name = f"hwplug/kernels/csrc/{source.name}"
        if name not in names:
            problems.append(f"the wheel lacks {name} (built at first use)")
    with tarfile.open(sdist) as tf:
        members = tf.getnames()
    top = members[0].split("/")[0]
    for needed in ("pyproject.toml", "README.md", "src/hwplug/__init__.py"):
        if f"{top}/{needed}" not in members:
            problems.append(f"the sdist lacks {needed}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--keep", type=Path, default=None, help="build into DIR and keep it")
    args = parser.parse_args(argv)
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    with tempfile.TemporaryDirectory(prefix="hwplug-release-") as tmp:
        out = args.keep or Path(tmp) / "dist"
        out.mkdir(parents=True, exist_ok=True)
        print(f"building the sdist and the wheel into {out}", flush=True)
        run(sys.executable, "-m", "hatchling", "build", "-d", str(out), cwd=REPO)
        wheel = next(out.glob("hwplug-*.whl"))
        sdist = next(out.glob("hwplug-*.tar.gz"))
        problems = check_metadata(wheel, sdist, project)
        if problems:
            for problem in problems:
                print(f"release check: {problem}", file=sys.stderr)
            return 1
        print(f"metadata of {wheel.name} and {sdist.name}: ok", flush=True)
        venv = Path(tmp) / "venv"
        print(f"installing {wheel.name} into a clean virtual environment", flush=True)
        run(sys.executable, "-m", "venv", str(venv))
        pip = str(venv / "bin" / "pip")
        run(pip, "install", "--quiet", TORCH_PIN)
        run(pip, "install", "--quiet", str(wheel))
        python = str(venv / "bin" / "python")
        code = (
            "import sys, hwplug; p = hwplug.current_platform; "
            "assert 'torch' not in sys.modules, 'import hwplug imported torch'; "
            "print(hwplug.__version__, p.name)"
        )
        print(run(python, "-c", code, cwd=Path(tmp)).strip(), flush=True)
        run(str(venv / "bin" / "hwplug"), "info", cwd=Path(tmp))
        # the native CPU kernels build from the installed sources (where a compiler is)
        kernel = "from hwplug.kernels import native_decode_unavailable_reason as r; print(r())"
        cache = f"XDG_CACHE_HOME={Path(tmp) / 'cache'}"
        said = run("env", cache, python, "-c", kernel, cwd=Path(tmp)).strip()
        if said != "None" and "no C compiler" not in said:
            print(f"release check: the installed native CPU kernels do not build: {said}")
            return 1
        run(str(venv / "bin" / "hwplug"), "resolve", "--simulate", "h100", "--json", cwd=Path(tmp))
        print("release check passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
