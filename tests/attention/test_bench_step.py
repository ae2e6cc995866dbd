"""benchmarks/bench_attention_step.py runs end to end (small sizes; no timing asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_attention_step.py"


def test_the_step_benchmark_prints_its_report() -> None:
    args = ["--layers", "2", "--seqs", "2", "--step-context", "20", "--contexts", "17,40"]
    result = subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--repeats", "1"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["step"]["layers"] == 2
    assert report["step"]["planned_per_layer_ratio"] > 0
    assert [case["context"] for case in report["decode_vs_sdpa"]] == [17, 40]


def test_bad_arguments_exit_2() -> None:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--contexts", "a,b"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2 and "--contexts" in result.stderr
