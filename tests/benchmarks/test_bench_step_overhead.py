"""benchmarks/bench_step_overhead.py: the attribution of a step's time, and a run on a
small checkpoint (the report's parts add up to the measured step)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_step_overhead.py"
ROOT = SCRIPT.parents[1]


def _load():  # (the script imports bench_peers from beside itself)
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        spec = importlib.util.spec_from_file_location("bench_step_overhead", SCRIPT)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(SCRIPT.parent))
    return module


def test_the_parts_are_the_kernels_their_doors_the_skeleton_and_the_rest() -> None:
    times = {
        "full": {"step": 20.0, "linear": 12.0, "attention": 1.0},
        "no_kernels": {"step": 2.0, "linear": 0.0, "attention": 0.0},
        "attention_only": {"step": 4.5, "linear": 0.0, "attention": 0.9},
        "linears_only": {"step": 15.0, "linear": 11.5, "attention": 0.0},
    }
    parts = _load().attribute(times)
    assert parts == {
        "linear kernels": 12.0,
        "linear doors": 1.5,  # 15 - 2 - 11.5
        "attention kernel": 1.0,
        "attention Python": 1.6,  # 4.5 - 2 - 0.9
        "skeleton": 2.0,
        "interaction": 1.9,  # 20 - (12 + 1.5 + 1 + 1.6 + 2)
    }
    assert sum(parts.values()) == pytest.approx(times["full"]["step"])


def test_a_run_on_a_small_checkpoint_times_every_way_and_splits_the_step(tmp_path: Path) -> None:
    from tiny_engine.make_checkpoint import make_checkpoint

    llama = make_checkpoint(tmp_path / "llama")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "examples/tiny_engine/src")]),
        "HWPLUG_CPU_STEP_GRAPHS": "1",
    }
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--checkpoint", str(llama), "--dtype", "fp32",
         "--context", "20", "--repeats", "3"],
        capture_output=True, text=True, timeout=600, env=env, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    medians = report["median_ms"]
    assert set(medians) == {"full", "no_kernels", "attention_only", "linears_only", "door"}
    assert report["door_step_ms"] == medians["door"]["step"] > 0
    # the door runs the linears without the Python the other ways time (where it is open)
    if report["op_door"] == "open":
        assert medians["door"]["linear"] == 0
    assert medians["full"]["linear"] > 0 and medians["full"]["attention"] > 0
    assert medians["no_kernels"]["linear"] == medians["no_kernels"]["attention"] == 0
    assert medians["linears_only"]["attention"] == 0 and medians["attention_only"]["linear"] == 0
    parts = report["parts_ms"]
    assert sum(parts.values()) == pytest.approx(medians["full"]["step"], abs=0.01)
