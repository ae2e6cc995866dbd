"""Custom ops: registration, enabling, per-platform dispatch and out-of-tree replacement."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import hwplug
from hwplug.core import custom_op as custom_op_module
from hwplug.core.config import CompilationConfig, EngineConfig
from hwplug.core.custom_op import (
    CustomOp,
    compilation_config_for_ops,
    custom_op_enabled,
    forward_method_name,
    get_op_compilation_config,
    op_registry,
    op_registry_oot,
)
from hwplug.core.errors import ConfigError
from hwplug.core.platform import Platform


@pytest.fixture(autouse=True)
def clean_registries() -> Iterator[None]:
    saved, saved_oot = dict(op_registry), dict(op_registry_oot)
    yield
    op_registry.clear()
    op_registry.update(saved)
    op_registry_oot.clear()
    op_registry_oot.update(saved_oot)


class NpuPlatform(Platform):
    """A vendor platform hwplug knows nothing about."""

    name = "npu"
    device_type = "npu"


PLATFORMS = {
    "h100": "forward_cuda",
    "mi300x": "forward_hip",
    "xeon-spr": "forward_cpu",
    "gaudi2": "forward_hpu",
    "max-1550": "forward_xpu",
}


def make_op_class(name: str = "scale_op") -> type:
    """A custom op whose every forward says which one ran."""

    @CustomOp.register(name)
    class ScaleOp(CustomOp):
        def __init__(self, factor: float = 2.0) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.full((1,), factor))

        def forward_native(self, x: torch.Tensor) -> tuple[str, torch.Tensor]:
            return "native", x * self.weight

        def forward_cuda(self, x: torch.Tensor) -> tuple[str, torch.Tensor]:
            return "cuda", x * self.weight

        def forward_hip(self, x: torch.Tensor) -> tuple[str, torch.Tensor]:
            return "hip", x * self.weight

        def forward_cpu(self, x: torch.Tensor) -> tuple[str, torch.Tensor]:
            return "cpu", x * self.weight

        def forward_hpu(self, x: torch.Tensor) -> tuple[str, torch.Tensor]:
            return "hpu", x * self.weight

        def forward_xpu(self, x: torch.Tensor) -> tuple[str, torch.Tensor]:
            return "xpu", x * self.weight

        def forward_oot(self, x: torch.Tensor) -> tuple[str, torch.Tensor]:
            return "oot", x * self.weight

    return ScaleOp


def enabled_config(**kwargs: Any) -> CompilationConfig:
    return CompilationConfig(custom_ops=["all"], **kwargs)


# -- the module stays torch-free until CustomOp is used ----------------------------------


def test_importing_the_graph_and_op_modules_does_not_import_torch() -> None:
    code = (
        "import sys\n"
        "import hwplug.core.custom_op as c, hwplug.core.graphs, hwplug.compilation\n"
        "import hwplug.platforms.cuda_graphs\nimport hwplug.platforms.hpu.graphs\n"
        "assert c.custom_op_enabled('x', __import__('hwplug.core.config').core.config"
        ".CompilationConfig(custom_ops=['+x']))\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_custom_op_is_an_nn_module_built_once() -> None:
    assert issubclass(CustomOp, torch.nn.Module)
    assert custom_op_module.CustomOp is CustomOp
    assert CustomOp.__module__ == "hwplug.core.custom_op"
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        custom_op_module.Nope


# -- dispatch by platform ------------------------------------------------------------------


@pytest.mark.parametrize(("profile", "method"), sorted(PLATFORMS.items()))
def test_enabled_op_runs_the_current_platforms_forward(profile: str, method: str) -> None:
    op_cls = make_op_class()
    with hwplug.use_platform(profile), compilation_config_for_ops(enabled_config()):
        op = op_cls(3.0)
    label, out = op(torch.ones(2))
    assert f"forward_{label}" == method
    assert torch.equal(out, torch.full((2,), 3.0))


def test_unknown_platform_runs_forward_oot() -> None:
    op_cls = make_op_class()
    with hwplug.use_platform(NpuPlatform()), compilation_config_for_ops(enabled_config()):
        assert op_cls()(torch.ones(1))[0] == "oot"


def test_the_choice_is_made_at_construction() -> None:
    op_cls = make_op_class()
    with compilation_config_for_ops(enabled_config()):
        with hwplug.use_platform("h100"):
            op = op_cls()
        with hwplug.use_platform("gaudi2"):
            assert op(torch.ones(1))[0] == "cuda"


@pytest.mark.parametrize(
    ("platform", "method"),
    [*PLATFORMS.items(), ("npu", "forward_oot"), ("tpu", "forward_oot")],
)
def test_forward_method_name_per_platform(platform: str, method: str) -> None:
    if platform in PLATFORMS:
        with hwplug.use_platform(platform) as p:
            assert forward_method_name(p) == method
    else:
        assert forward_method_name(platform) == method


def test_every_platform_method_defaults_to_native() -> None:
    @CustomOp.register("only_native")
    class OnlyNative(CustomOp):
        def forward_native(self, x: torch.Tensor) -> torch.Tensor:
            return x + 1

    for profile in [*PLATFORMS, NpuPlatform()]:
        with hwplug.use_platform(profile), compilation_config_for_ops(enabled_config()):
            assert torch.equal(OnlyNative()(torch.zeros(1)), torch.ones(1))


def test_rocm_reuses_forward_cuda_unless_forward_hip_exists() -> None:
    @CustomOp.register("cuda_kernel")
    class CudaKernel(CustomOp):
        def forward_native(self) -> str:
            return "native"

        def forward_cuda(self) -> str:
            return "cuda"

    with hwplug.use_platform("mi300x"), compilation_config_for_ops(enabled_config()):
        assert CudaKernel()() == "cuda"


def test_missing_forward_native_says_so() -> None:
    @CustomOp.register("incomplete")
    class Incomplete(CustomOp):
        pass

    with hwplug.use_platform("xeon-spr"), compilation_config_for_ops(enabled_config()):
        op = Incomplete()
    with pytest.raises(NotImplementedError, match="Incomplete must implement forward_native"):
        op()


# -- enabling -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("custom_ops", "level", "use_inductor", "enabled"),
    [
        ([], None, True, True),
        ([], 0, True, True),
        ([], 2, True, True),
        ([], 3, True, False),
        ([], 3, False, True),
        (["all"], 3, True, True),
        (["none"], 0, False, False),
        (["none", "+scale_op"], 3, True, True),
        (["all", "-scale_op"], 0, True, False),
        (["+scale_op"], 3, True, True),
        (["-scale_op"], 0, True, False),
        (["+other"], 3, True, False),
        (["none", "+other"], 0, True, False),
    ],
)
def test_custom_ops_setting_decides_enabling(
    custom_ops: list[str], level: int | None, use_inductor: bool, enabled: bool
) -> None:
    config = CompilationConfig(custom_ops=custom_ops, level=level, use_inductor=use_inductor)
    assert custom_op_enabled("scale_op", config) is enabled
    op_cls = make_op_class()
    assert op_cls.enabled(config) is enabled
    with hwplug.use_platform("h100"), compilation_config_for_ops(config):
        label, _ = op_cls()(torch.ones(1))
    assert label == ("cuda" if enabled else "native")


def test_enabling_and_disabling_the_same_op_is_a_config_error() -> None:
    config = CompilationConfig(custom_ops=["+scale_op", "-scale_op"])
    with pytest.raises(ConfigError, match=r"compilation\.custom_ops both enables and disables"):
        custom_op_enabled("scale_op", config)


def test_instances_are_counted_into_the_config(caplog: pytest.LogCaptureFixture) -> None:
    op_cls = make_op_class()

    @CustomOp.register("other_op")
    class Other(CustomOp):
        def forward_native(self) -> None:
            return None

    config = CompilationConfig(custom_ops=["none", "+scale_op", "-missing_op"])
    with hwplug.use_platform("h100"), compilation_config_for_ops(config):
        op_cls()
        op_cls()
        Other()
    assert config.enabled_custom_ops == {"scale_op": 2}
    assert config.disabled_custom_ops == {"other_op": 1}
    with caplog.at_level(logging.WARNING):
        config.custom_op_log_check()
    assert "missing_op" in caplog.text


def test_engine_config_can_be_given_for_its_compilation_part() -> None:
    engine = EngineConfig(compilation=CompilationConfig(custom_ops=["none"]))
    with compilation_config_for_ops(engine) as config:
        assert config is engine.compilation
        assert get_op_compilation_config() is engine.compilation
        make_op_class()()
    assert engine.compilation.disabled_custom_ops == {"scale_op": 1}


def test_a_process_default_config_is_used_outside_any_block() -> None:
    default = get_op_compilation_config()
    assert isinstance(default, CompilationConfig)
    assert get_op_compilation_config() is default


def test_only_compilation_configs_are_accepted() -> None:
    with pytest.raises(ValueError, match="needs a CompilationConfig or an EngineConfig"):
        with compilation_config_for_ops(object()):
            pass


def test_unregistered_ops_are_switched_by_class_name() -> None:
    class Adhoc(CustomOp):
        def forward_native(self) -> str:
            return "native"

    assert Adhoc.op_name() == "Adhoc"
    config = CompilationConfig(custom_ops=["-Adhoc"])
    assert not Adhoc.enabled(config)


# -- registration ----------------------------------------------------------------------------


def test_register_names_the_class_and_fills_the_registry() -> None:
    op_cls = make_op_class("my_norm")
    assert op_cls.name == "my_norm"
    assert op_cls.op_name() == "my_norm"
    assert op_registry["my_norm"] is op_cls
    assert CustomOp.op_registry is op_registry


def test_a_name_cannot_be_taken_twice() -> None:
    make_op_class("taken")

    with pytest.raises(ValueError, match="'taken' is already registered by"):

        @CustomOp.register("taken")
        class Another(CustomOp):
            pass


@pytest.mark.parametrize("bad", ["", "+x", "-x", "all", "none", 3])
def test_bad_names_are_rejected(bad: object) -> None:
    with pytest.raises(ValueError, match="needs an op name"):
        CustomOp.register(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="needs an op name"):
        CustomOp.register_oot(bad)  # type: ignore[arg-type]


# -- out-of-tree replacement --------------------------------------------------------------------


def test_oot_subclass_replaces_the_op_everywhere() -> None:
    op_cls = make_op_class()

    @CustomOp.register_oot("scale_op")
    class VendorScale(op_cls):  # type: ignore[misc, valid-type]
        def forward_oot(self, x: torch.Tensor) -> tuple[str, torch.Tensor]:
            return "vendor", x * self.weight * 10

    with hwplug.use_platform(NpuPlatform()), compilation_config_for_ops(enabled_config()):
        op = op_cls(2.0)
    assert type(op) is VendorScale
    label, out = op(torch.ones(1))
    assert label == "vendor"
    assert torch.equal(out, torch.full((1,), 20.0))
    assert VendorScale.op_name() == "scale_op"


def test_platform_specific_replacement_applies_only_there() -> None:
    op_cls = make_op_class()

    @CustomOp.register_oot("scale_op", platform="npu")
    class NpuScale(op_cls):  # type: ignore[misc, valid-type]
        pass

    with compilation_config_for_ops(enabled_config()):
        with hwplug.use_platform(NpuPlatform()):
            assert type(op_cls()) is NpuScale
        with hwplug.use_platform("h100"):
            assert type(op_cls()) is op_cls


def test_platform_specific_replacement_beats_a_general_one() -> None:
    op_cls = make_op_class()

    @CustomOp.register_oot("scale_op")
    class General(op_cls):  # type: ignore[misc, valid-type]
        pass

    @CustomOp.register_oot("scale_op", platform="npu")
    class Specific(op_cls):  # type: ignore[misc, valid-type]
        pass

    with compilation_config_for_ops(enabled_config()):
        with hwplug.use_platform(NpuPlatform()):
            assert type(op_cls()) is Specific
        with hwplug.use_platform("gaudi2"):
            assert type(op_cls()) is General


def test_unrelated_replacement_class_is_built_with_the_same_arguments() -> None:
    op_cls = make_op_class()

    @CustomOp.register_oot("scale_op", platform="npu")
    class Standalone(CustomOp):
        def __init__(self, factor: float = 2.0) -> None:
            super().__init__()
            self.factor = factor

        def forward_native(self, x: torch.Tensor) -> tuple[str, torch.Tensor]:
            return "standalone", x * self.factor

    with hwplug.use_platform(NpuPlatform()), compilation_config_for_ops(enabled_config()):
        op = op_cls(5.0)
    assert type(op) is Standalone
    assert op.factor == 5.0
    assert op(torch.ones(1))[0] == "standalone"


def test_oot_name_defaults_to_the_class_name() -> None:
    @CustomOp.register_oot()
    class rms_norm(CustomOp):
        pass

    assert op_registry_oot[("rms_norm", None)] is rms_norm


# -- works inside torch.compile ----------------------------------------------------------------


def test_custom_op_compiles_with_dynamo() -> None:
    op_cls = make_op_class()
    with hwplug.use_platform("xeon-spr"), compilation_config_for_ops(enabled_config()):
        op = op_cls(4.0)
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: op(x)[1] + 1, backend="eager")
    assert torch.equal(compiled(torch.ones(3)), torch.full((3,), 5.0))
