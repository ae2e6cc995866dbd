"""Config hashes are identical in every process and under any PYTHONHASHSEED."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SRC = Path(__file__).resolve().parents[3] / "src"

# Builds a config whose str() would differ between processes if hashed naively:
# callables (addresses in their repr) and sets (order follows the string hash seed).
BUILD = """
import os.path
from hwplug.core.config import EngineConfig, CompilationConfig
from hwplug.core.config._common import jsonable

config = EngineConfig.from_dict({
    "model": {"dtype": "bf16", "num_layers": 4},
    "cache": {"cache_dtype": "fp8"},
    "parallel": {"tensor_parallel_size": 2},
})
config.compilation = CompilationConfig(
    level=3,
    custom_ops=["none", "+rms_norm"],
    inductor_passes={"by_object": os.path.join, "by_name": "os.path.basename", "own": jsonable},
    inductor_compile_config={"tags": {"alpha", "beta", "gamma", "delta", "epsilon"}},
    pass_config={"enable_noop": True, "enable_fusion": True},
)
hashes = {
    "engine": config.compute_hash(),
    "compilation": config.compilation.compute_hash(),
    "cache": config.cache.compute_hash(),
    "model": config.model.compute_hash(),
    "parallel": config.parallel.compute_hash(),
    "pass_config": config.compilation.pass_config.uuid(),
}
"""


def hashes_here() -> dict[str, Any]:
    namespace: dict[str, Any] = {}
    exec(BUILD, namespace)
    return namespace["hashes"]


@pytest.mark.slow
def test_hashes_are_the_same_in_every_process_and_hash_seed() -> None:
    code = BUILD + "\nimport json\nprint(json.dumps(hashes))\n"
    pythonpath = os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONPATH": pythonpath, "PYTHONHASHSEED": seed},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed in ("0", "1", "4242", "random")
    ]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    expected = hashes_here()
    for result in results:
        assert result == expected


def test_set_order_and_callables_do_not_leak_into_the_hash() -> None:
    from hwplug.core.config import CompilationConfig

    one = CompilationConfig(inductor_compile_config={"tags": {"x", "y", "z"}})
    two = CompilationConfig(inductor_compile_config={"tags": {"z", "y", "x"}})
    assert one.compute_hash() == two.compute_hash()
    assert "0x" not in str(hashes_here())
