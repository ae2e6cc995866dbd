"""``hwplug.compilation.compile_model``: the resolved levels, and many engines per process."""

from __future__ import annotations

import pytest
import torch

import hwplug
from hwplug.compilation import compile_model
from hwplug.core.config import EngineConfig


class Scaled(torch.nn.Module):
    """A model whose forward depends on a Python attribute: Dynamo guards on its value."""

    def __init__(self, factor: int) -> None:
        super().__init__()
        self.factor = factor
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) * self.factor


def _config(level: int) -> EngineConfig:
    config = EngineConfig.from_dict(
        {"model": {"dtype": "float32"}, "compilation": {"level": level, "backend": "eager"}}
    )
    return hwplug.resolve(config, platform="cpu-generic").config


def test_level_0_returns_the_model_itself() -> None:
    model = Scaled(2)
    assert compile_model(model, _config(0), platform=hwplug.get_platform()) is model


def test_more_models_than_dynamos_recompile_limit_compile_in_one_process() -> None:
    limit = torch._dynamo.config.recompile_limit
    x = torch.randn(3, 4)
    for factor in range(limit + 4):
        model = Scaled(factor)
        compiled = compile_model(model, _config(1), platform=hwplug.get_platform())
        torch.testing.assert_close(compiled(x), model(x))


def test_the_same_model_class_compiled_plainly_hits_the_limit() -> None:
    """What compile_model avoids (so the test above can fail)."""
    limit = torch._dynamo.config.recompile_limit
    x = torch.randn(3, 4)
    with pytest.raises(Exception, match="fullgraph=True|recompile"):
        for factor in range(100, 100 + limit + 4):
            torch.compile(Scaled(factor), backend="eager", fullgraph=True)(x)
    torch._dynamo.reset()


def test_forward_hooks_of_the_model_still_run() -> None:
    model = Scaled(3)
    seen: list[int] = []
    model.register_forward_hook(lambda module, args, out: seen.append(1))
    compile_model(model, _config(1), platform=hwplug.get_platform())(torch.randn(2, 4))
    assert seen == [1]


class Epsilon(torch.nn.Module):
    """A model with a float attribute (a norm's epsilon) handed to an op."""

    def __init__(self, eps: float) -> None:
        super().__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.layer_norm(x, (x.shape[-1],), eps=self.eps)


def test_float_attributes_are_traced_as_constants_in_one_attempt() -> None:
    """A model's floats are specialised from the start: Dynamo would otherwise make
    them symbols, find that the op cannot take one, and restart its whole analysis.
    The result is right, a changed float is seen (its guard fails and the model is
    traced again), and the setting does not leak out of the call."""
    from torch._dynamo.utils import compilation_time_metrics

    config = EngineConfig.from_dict(
        {"model": {"dtype": "float32"}, "compilation": {"level": 2, "backend": "aot_eager"}}
    )
    config = hwplug.resolve(config, platform="cpu-generic").config
    model = Epsilon(1e-6)
    compiled = compile_model(model, config, platform=hwplug.get_platform())
    compilation_time_metrics.clear()
    x = torch.randn(5, 8)
    torch.testing.assert_close(compiled(x), model(x))
    attempts = sorted(key for key in compilation_time_metrics if key.startswith("compile_attempt"))
    assert attempts == ["compile_attempt_0"]
    assert torch._dynamo.config.specialize_float is False
    model.eps = 10.0
    torch.testing.assert_close(compiled(x), model(x))
