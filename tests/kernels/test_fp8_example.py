"""The end-to-end example ``examples/fp8_kv_cache.py`` runs and reports sensible numbers."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fp8_kv_cache.py"


def test_fp8_example_runs_end_to_end() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "HWPLUG_PLATFORM")}
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), "--tokens", "64"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "NVIDIA H100 80GB HBM3 (simulated), fp8 = torch.float8_e4m3fn" in out
    errors = [float(v) for _, v in re.findall(r"(key|value) (\d+\.\d+)", out)]
    assert len(errors) == 2
    # keys ~ N(0, 1), values ~ N(0, 16): e4m3 keeps 3 mantissa bits
    assert 0 < errors[0] < 0.5
    assert 0 < errors[1] < 2.0
    assert re.search(r"saved \d+\.\d+ GiB \(50%\)", out)
