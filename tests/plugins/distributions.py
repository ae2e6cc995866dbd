"""Build throwaway installed distributions (real package metadata) for plugin tests."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src"


def make_distribution(
    site: Path,
    name: str,
    *,
    entry_points: Mapping[str, Mapping[str, str]],
    modules: Mapping[str, str],
    version: str = "1.0",
) -> Path:
    """Write ``modules`` and a ``<name>-<version>.dist-info`` into ``site``.

    The result is what pip leaves behind: importlib.metadata finds the
    distribution and its entry points once ``site`` is on ``sys.path``.
    """
    site.mkdir(parents=True, exist_ok=True)
    for filename, source in modules.items():
        path = site / filename
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    dist_info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    dist_info.mkdir(exist_ok=True)
    (dist_info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    )
    lines = []
    for group, eps in entry_points.items():
        lines.append(f"[{group}]")
        lines.extend(f"{ep_name} = {value}" for ep_name, value in eps.items())
        lines.append("")
    (dist_info / "entry_points.txt").write_text("\n".join(lines))
    (dist_info / "RECORD").write_text("")
    return site


def clean_env(**extra: str) -> dict[str, str]:
    """The current environment without any HWPLUG_* variable, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HWPLUG_", "ACME_"))}
    env.update(extra)
    return env


def run_python(
    code: str,
    *,
    paths: list[Path] = (),
    env: Mapping[str, str] | None = None,  # type: ignore[assignment]
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter with ``paths`` first on ``sys.path``."""
    environment = dict(clean_env() if env is None else env)
    pythonpath = [str(p) for p in paths] + [str(SRC)]
    environment["PYTHONPATH"] = os.pathsep.join(pythonpath)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=environment,
        timeout=timeout,
        check=False,
    )
