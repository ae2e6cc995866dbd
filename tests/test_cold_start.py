"""Selecting the platform stays cheap: neither torch nor pydantic is imported."""

from __future__ import annotations

import subprocess
import sys


def heavy_modules_after(code: str, heavy: tuple[str, ...] = ("torch", "pydantic")) -> str:
    """Run ``code`` in a fresh interpreter; the ``heavy`` modules it imported, as printed."""
    code += f"; print([m for m in {heavy!r} if m in sys.modules])"
    result = subprocess.run(
        [sys.executable, "-c", "import sys; " + code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_current_platform_imports_neither_torch_nor_pydantic() -> None:
    assert heavy_modules_after("import hwplug; hwplug.current_platform") == "[]"


def test_handing_out_the_platforms_runtime_imports_neither() -> None:
    assert heavy_modules_after("import hwplug; hwplug.current_platform.runtime") == "[]"


def test_the_command_line_and_the_pytest_plugin_need_no_test_extra() -> None:
    # hypothesis (the test extra) loads only when the conformance kit runs.
    code = "import hwplug.cli, hwplug.plugins.pytest_plugin"
    assert heavy_modules_after(code, ("hypothesis",)) == "[]"
