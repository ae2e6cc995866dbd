"""docs/support-matrix.md is generated from the platforms' rules and must be current."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from hwplug.matrix import builtin_plugin_manager, support_matrix, support_matrix_page

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "support-matrix.md"


def test_committed_page_is_current() -> None:
    assert PAGE.read_text(encoding="utf-8") == support_matrix_page(), (
        "docs/support-matrix.md is stale: run python scripts/gen_support_matrix.py"
    )


def test_page_covers_every_builtin_profile() -> None:
    text = PAGE.read_text(encoding="utf-8")
    manager = builtin_plugin_manager()
    for profile in manager.known_profiles():
        assert f"| `{profile}` |" in text
    for platform in ("cuda", "rocm", "cpu", "hpu", "xpu"):
        assert f"\n## {platform}\n" in text


def test_page_ignores_installed_vendor_plugins() -> None:
    rows = support_matrix(builtin_plugin_manager())
    assert {row.platform for row in rows} == {"cuda", "rocm", "cpu", "hpu", "xpu"}


def test_generator_check_mode(tmp_path: Path) -> None:
    script = ROOT / "scripts" / "gen_support_matrix.py"
    proc = subprocess.run(
        [sys.executable, str(script), "--check"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
