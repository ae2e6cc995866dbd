"""Selecting the platform stays cheap: neither torch nor pydantic is imported."""

from __future__ import annotations

import subprocess
import sys


def test_current_platform_imports_neither_torch_nor_pydantic() -> None:
    code = (
        "import sys, hwplug; hwplug.current_platform; "
        "print([m for m in ('torch', 'pydantic') if m in sys.modules])"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
