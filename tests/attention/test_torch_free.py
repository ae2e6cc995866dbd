"""Resolution runs torch-free: importing hwplug.attention and asking problem() import no torch."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import sys

    import hwplug
    import hwplug.attention
    from hwplug.attention import BUILTIN_BACKENDS, available_backends, get_backend
    from hwplug.core.config import CacheConfig, EngineConfig, ModelConfig

    configs = [
        EngineConfig(),
        EngineConfig(model=ModelConfig(head_size=72, sliding_window=64)),
        EngineConfig(model=ModelConfig(use_mla=True)),
        EngineConfig(cache=CacheConfig(cache_dtype="fp8_e5m2", block_size=16)),
    ]
    answers = []
    for profile in ("h100", "mi300x", "cpu-generic", "gaudi2"):
        with hwplug.use_platform(profile) as platform:
            for cls in available_backends().values():
                for config in configs:
                    answers.append(cls.problem(config, platform))
    assert get_backend("triton") is BUILTIN_BACKENDS["triton"]
    assert any(a is None for a in answers) and any(a for a in answers)
    loaded = sorted(m for m in ("torch", "triton", "numpy") if m in sys.modules)
    print("loaded:", loaded)
    sys.exit(1 if "torch" in sys.modules else 0)
    """
)


def test_import_and_problem_do_not_import_torch() -> None:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "loaded: []" in result.stdout
