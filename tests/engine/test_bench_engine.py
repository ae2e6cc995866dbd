"""benchmarks/bench_engine.py runs end to end and reports what the docs quote."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from tests.engine.conftest import REPO

pytest.importorskip("transformers")

SCRIPT = REPO / "benchmarks" / "bench_engine.py"
SMALL = [
    "--layers", "1", "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--vocab", "256",
    "--batch", "2", "--prompt-len", "8", "--max-tokens", "4", "--repeats", "1",
]  # fmt: skip


def test_a_small_run_reports_both_engines_and_their_ratios() -> None:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), *SMALL, "--set", "compilation.level=0"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert report["workload"] == {
        "batch": 2,
        "prompt_len": 8,
        "max_tokens": 4,
        "dtype": "float32",
        "device": "cpu",
        "threads": torch.get_num_threads(),
    }
    engine = report["tiny_engine"]
    assert engine["platform"] == "cpu"
    assert engine["compilation_level"] == 0
    assert engine["attention_backend"] == "torch"
    for side in (report["transformers"], engine):
        assert side["e2e_tokens_per_s"] > 0 and side["decode_tokens_per_s"] > 0
    expected = engine["e2e_tokens_per_s"] / report["transformers"]["e2e_tokens_per_s"]
    assert report["ratio_e2e"] == pytest.approx(expected, abs=0.01)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible")
def test_cuda_without_a_gpu_is_one_line_and_status_2() -> None:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cuda"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "bench_engine: --device cuda needs a CUDA or ROCm GPU; none is visible"
    )
    assert result.stdout == ""


@pytest.mark.slow
def test_the_mesh_benchmark_runs_every_layout_with_one_ranks_tokens() -> None:
    script = REPO / "benchmarks" / "bench_tp.py"
    small = ["--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2"]
    small += ["--vocab", "256", "--batch", "2", "--prompt-len", "4", "--max-tokens", "2"]
    result = subprocess.run(
        [sys.executable, str(script), *small, "--repeats", "1", "--eager"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    layouts = report["layouts"]
    assert list(layouts) == ["tp1", "tp2", "pp2", "dp2"]
    assert all(entry["same_tokens_as_tp1"] is True for entry in layouts.values())
    assert layouts["tp1"]["steps"] == layouts["tp2"]["steps"] == layouts["pp2"]["steps"] == 2
    assert layouts["dp2"]["steps"] == 2  # each replica decodes its prompt in two steps
    assert layouts["tp1"]["ratio_to_tp1"] == 1.0
    assert "pp2_extra_ms_per_step_per_stage_boundary" in report["costs_here"]
    assert report["transfer"]["send_ms"] > 0 and report["transfer"]["all_reduce_ms"] > 0
    assert set(report["on_hosts_of_their_own"]) == {"tp2", "pp2", "dp2"}


def test_the_mesh_benchmark_names_a_malformed_layout() -> None:
    script = REPO / "benchmarks" / "bench_tp.py"
    result = subprocess.run(
        [sys.executable, str(script), "--layouts", "tp2,zz3"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2
    assert "layout 'zz3' is not like tp2, pp2, dp2 or tp2xpp2" in result.stderr
