"""Resolution chooses or checks the attention backend and fits the graph mode (SPEC 12)."""

from __future__ import annotations

import logging

import pytest

import hwplug
from hwplug.attention import AttentionBackend, TorchAttentionBackend, available_backends
from hwplug.core.config import CUDAGraphMode, EngineConfig
from hwplug.core.graphs import AttentionGraphSupport
from hwplug.core.resolve import ChangeLog


def resolve(profile: str, **sections: dict[str, object]) -> hwplug.Resolution:
    return hwplug.resolve(EngineConfig.from_dict(sections), platform=profile)


@pytest.mark.parametrize(
    ("profile", "backend"),
    [
        ("h100", "triton"),
        ("a100", "triton"),
        ("mi300x", "triton"),
        ("max-1550", "triton"),
        ("cpu-generic", "torch"),
        ("xeon-spr", "torch"),
        ("gaudi2", "torch"),
    ],
)
def test_the_first_backend_of_the_platform_order_is_chosen_and_recorded(
    profile: str, backend: str
) -> None:
    resolution = resolve(profile)
    assert resolution.config.attention.backend == backend
    [change] = resolution.changes_to("attention.backend")
    assert change.source == "engine"
    assert f"first of {resolution.platform.name}'s attention order" in change.reason


def test_a_backend_that_does_not_fit_is_skipped_with_its_reason() -> None:
    resolution = resolve("h100", model={"head_size": 40})
    assert resolution.config.attention.backend == "torch"
    [change] = resolution.changes_to("attention.backend")
    assert "skipped triton: model.head_size=40" in change.reason


def test_an_unknown_backend_lists_the_known_ones() -> None:
    with pytest.raises(hwplug.ConfigError) as err:
        resolve("h100", attention={"backend": "flash"})
    message = str(err.value)
    assert "attention.backend='flash' (set by the user)" in message
    assert "it is not installed (backends for platform " in message
    assert "torch" in message and "triton" in message


def test_an_explicit_backend_that_cannot_run_names_device_problem_and_what_works() -> None:
    with pytest.raises(hwplug.ConfigError) as err:
        resolve("cpu-generic", attention={"backend": "triton"})
    message = str(err.value)
    assert (
        "attention.backend='triton' (set by the user) cannot run on Generic x86-64 CPU" in message
    )
    assert "runs Triton kernels" in message
    assert "use attention.backend='torch'" in message


def test_a_backend_set_by_a_plugin_is_checked_and_the_plugin_named(registered) -> None:
    class Chooser:
        @hwplug.hookimpl
        def hwplug_check_and_update_config(self, changes: ChangeLog) -> None:
            changes.record("attention.backend", "triton", "our favourite")

    registered(Chooser(), "chooser")
    with pytest.raises(hwplug.ConfigError, match=r"\(set by chooser\) cannot run"):
        resolve("cpu-generic")
    assert resolve("h100").config.attention.backend == "triton"


def test_explicit_backend_that_fits_is_kept_without_a_change() -> None:
    resolution = resolve("h100", attention={"backend": "torch"})
    assert resolution.config.attention.backend == "torch"
    assert resolution.changes_to("attention.backend") == []


def test_mla_models_resolve_without_a_backend_and_keep_their_mode(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="hwplug.resolve"):
        resolution = resolve("h100", model={"use_mla": True})
    assert resolution.config.attention.backend is None
    assert resolution.config.compilation.cudagraph_mode == CUDAGraphMode.FULL_AND_PIECEWISE
    assert "MLA" in caplog.text


def test_attention_free_models_keep_whatever_was_given() -> None:
    assert resolve("h100", model={"is_attention_free": True}).config.attention.backend is None
    kept = resolve(
        "cpu-generic", model={"is_attention_free": True}, attention={"backend": "triton"}
    )
    assert kept.config.attention.backend == "triton"  # unchecked and unused


def test_no_backend_fits_lists_every_candidate() -> None:
    with pytest.raises(hwplug.ConfigError) as err:
        resolve("cpu-generic", cache={"cache_dtype": "fp8_inc"}, model={"dtype": "bfloat16"})
    assert "fp8_inc" in str(err.value)


# --------------------------------------------------------------------------- graph modes


def test_an_unset_mode_is_fitted_to_the_backend_and_recorded() -> None:
    resolution = resolve("h100", attention={"backend": "torch"})
    assert resolution.config.compilation.cudagraph_mode == CUDAGraphMode.PIECEWISE
    fitted = resolution.changes_to("compilation.cudagraph_mode")[-1]
    assert fitted.source == "engine"
    assert "torch attention backend's graph support is NEVER" in fitted.reason


def test_an_explicit_mode_that_would_change_is_refused() -> None:
    with pytest.raises(hwplug.ConfigError) as err:
        resolve(
            "h100",
            attention={"backend": "torch"},
            compilation={"cudagraph_mode": "FULL_AND_PIECEWISE"},
        )
    message = str(err.value)
    assert "compilation.cudagraph_mode=FULL_AND_PIECEWISE cannot run with the torch" in message
    assert "NEVER" in message and "PIECEWISE" in message


def test_triton_keeps_full_graphs() -> None:
    resolution = resolve("h100", compilation={"cudagraph_mode": "FULL"})
    assert resolution.config.compilation.cudagraph_mode == CUDAGraphMode.FULL


def test_hpu_opts_out_of_the_fitting() -> None:
    resolution = resolve("gaudi2")
    assert resolution.config.attention.backend == "torch"
    assert resolution.config.compilation.cudagraph_mode == CUDAGraphMode.FULL


def test_hwplug_attention_op_joins_unset_splitting_ops_only() -> None:
    ops = resolve("h100").config.compilation.splitting_ops
    assert ops is not None
    assert ops[-2:] == ["hwplug.unified_attention", "hwplug.unified_attention_with_output"]
    given = ["vllm.unified_attention"]
    explicit = resolve("h100", compilation={"splitting_ops": given}).config.compilation
    assert explicit.splitting_ops == given


LEAVES_ATTENTION_IN = {"level": 3, "splitting_ops": ["vllm.unified_attention"]}
"""Piecewise compilation whose splitting ops leave hwplug's attention ops in the pieces."""


def test_explicit_piecewise_graphs_that_would_capture_the_torch_backend_are_refused() -> None:
    with pytest.raises(hwplug.ConfigError) as err:
        resolve(
            "h100",
            attention={"backend": "torch"},
            compilation={**LEAVES_ATTENTION_IN, "cudagraph_mode": "PIECEWISE"},
        )
    message = str(err.value)
    assert "compilation.cudagraph_mode=PIECEWISE cannot run on" in message
    assert "hwplug.unified_attention, hwplug.unified_attention_with_output" in message
    assert "the torch attention backend (graph support NEVER" in message
    assert "add hwplug.unified_attention" in message and "cudagraph_mode=NONE" in message


def test_unset_piecewise_graphs_that_would_capture_the_torch_backend_become_none() -> None:
    resolution = resolve("h100", attention={"backend": "torch"}, compilation=LEAVES_ATTENTION_IN)
    assert resolution.config.compilation.cudagraph_mode == CUDAGraphMode.NONE
    assert resolution.config.compilation.cudagraph_capture_sizes == []
    change = resolution.changes_to("compilation.cudagraph_mode")[-1]
    assert change.source == "engine"
    assert "inside the piecewise graphs" in change.reason and "torch" in change.reason


def test_piecewise_graphs_with_attention_split_out_keep_the_torch_backend() -> None:
    ops = ["hwplug.unified_attention", "hwplug.unified_attention_with_output"]
    resolution = resolve(
        "h100",
        attention={"backend": "torch"},
        compilation={"level": 3, "splitting_ops": ops, "cudagraph_mode": "PIECEWISE"},
    )
    assert resolution.config.compilation.cudagraph_mode == CUDAGraphMode.PIECEWISE


def test_half_split_attention_is_still_captured() -> None:
    """The model may call either op: both must be split out."""
    with pytest.raises(hwplug.ConfigError, match="leave hwplug.unified_attention_with_output"):
        resolve(
            "h100",
            attention={"backend": "torch"},
            compilation={
                "level": 3,
                "splitting_ops": ["hwplug.unified_attention"],
                "cudagraph_mode": "PIECEWISE",
            },
        )


def test_a_backend_that_runs_in_any_graph_may_be_captured_piecewise() -> None:
    resolution = resolve("h100", compilation={**LEAVES_ATTENTION_IN, "cudagraph_mode": "PIECEWISE"})
    assert resolution.config.attention.backend == "triton"
    assert resolution.config.compilation.cudagraph_mode == CUDAGraphMode.PIECEWISE


def test_a_decode_capturable_backend_keeps_its_full_decode_graphs(registered) -> None:
    class Provides:
        @hwplug.hookimpl
        def hwplug_attention_backends(self) -> list[type[AttentionBackend]]:
            return [Pretend]

    registered(Provides(), "provides")
    resolution = resolve("h100", attention={"backend": "pretend"}, compilation=LEAVES_ATTENTION_IN)
    assert resolution.config.compilation.cudagraph_mode == CUDAGraphMode.FULL_DECODE_ONLY
    with pytest.raises(hwplug.ConfigError, match="cudagraph_mode=FULL_DECODE_ONLY"):
        resolve(
            "h100",
            attention={"backend": "pretend"},
            compilation={**LEAVES_ATTENTION_IN, "cudagraph_mode": "FULL_AND_PIECEWISE"},
        )


def test_the_backend_is_part_of_the_config_hash() -> None:
    torch_config = EngineConfig.from_dict({"attention": {"backend": "torch"}})
    triton_config = EngineConfig.from_dict({"attention": {"backend": "triton"}})
    assert torch_config.compute_hash() != triton_config.compute_hash()


# --------------------------------------------------------------------------- plugin backends


class Pretend(TorchAttentionBackend):
    name = "pretend"
    graph_support = AttentionGraphSupport.UNIFORM_BATCH


def test_plugin_backends_join_the_registry_and_can_be_chosen(registered) -> None:
    class Provides:
        @hwplug.hookimpl
        def hwplug_attention_backends(self) -> list[type[AttentionBackend]]:
            return [Pretend]

    registered(Provides(), "provides")
    assert available_backends()["pretend"] is Pretend
    assert hwplug.attention.get_backend("pretend") is Pretend
    resolution = resolve("h100", attention={"backend": "pretend"})
    # UNIFORM_BATCH: mixed batches cannot be captured in full, decode can
    assert resolution.config.compilation.cudagraph_mode == CUDAGraphMode.FULL_AND_PIECEWISE


@pytest.mark.parametrize("name", ["vendor-fa", "a.b", "fa_3"])
def test_every_name_the_registry_accepts_can_be_chosen(registered, name: str) -> None:
    backend = type("Named", (TorchAttentionBackend,), {"name": name})

    class Provides:
        @hwplug.hookimpl
        def hwplug_attention_backends(self) -> list[type[AttentionBackend]]:
            return [backend]

    registered(Provides(), "provides")
    assert available_backends()[name] is backend
    resolution = resolve("cpu-generic", attention={"backend": name})
    assert resolution.config.attention.backend == name


@pytest.mark.parametrize("name", ["Vendor", "1fa", "fa\n", "fa x", "-fa"])
def test_a_name_the_config_refuses_the_registry_refuses_too(registered, name: str) -> None:
    backend = type("Named", (TorchAttentionBackend,), {"name": name})

    class Provides:
        @hwplug.hookimpl
        def hwplug_attention_backends(self) -> list[type[AttentionBackend]]:
            return [backend]

    registered(Provides(), "provides")
    with pytest.raises(hwplug.PluginError, match="with name"):
        available_backends()
    if name.strip().lower() == name:  # the config folds case and strips blanks
        with pytest.raises(ValueError, match="attention.backend"):
            EngineConfig.from_dict({"attention": {"backend": name}})


def test_a_backend_name_claimed_twice_names_both(registered) -> None:
    class Clash(TorchAttentionBackend):
        name = "triton"

    class Clashes:
        @hwplug.hookimpl
        def hwplug_attention_backends(self) -> list[type[AttentionBackend]]:
            return [Clash]

    registered(Clashes(), "clashes")
    with pytest.raises(hwplug.PluginError) as err:
        available_backends()
    assert "'triton' is claimed twice" in str(err.value) and "clashes" in str(err.value)


def test_a_raising_backend_hook_is_named_and_skipped(registered) -> None:
    class Raises:
        @hwplug.hookimpl
        def hwplug_attention_backends(self) -> list[type[AttentionBackend]]:
            raise RuntimeError("no kernels")

    installed = set(available_backends())  # the built-ins and installed plugins' backends
    registered(Raises(), "raises")
    with pytest.warns(UserWarning, match=r"'raises'.*hwplug_attention_backends.*no kernels"):
        backends = available_backends()
    assert set(backends) == installed
