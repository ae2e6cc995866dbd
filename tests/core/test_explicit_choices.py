"""An explicit choice is honoured or refused, never silently replaced (SPEC 5).

"Set by the user" means given: a constructor keyword, an assignment, a key of
a dict or file, a ``--set``, whatever the value (the default included).
Changes go only through ``changes.record``; anything else is caught.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import hwplug
from hwplug.core.config import (
    CacheConfig,
    CompilationConfig,
    EngineConfig,
    ModelConfig,
    SchedulerConfig,
)
from hwplug.core.resolve import ChangeLog, user_set_fields

# --------------------------------------------------------------------------- given, not value


@pytest.mark.parametrize(
    ("config", "path"),
    [
        (EngineConfig(scheduler=SchedulerConfig(max_num_seqs=256)), "scheduler.max_num_seqs"),
        (
            EngineConfig(cache=CacheConfig(gpu_memory_utilization=0.9)),
            "cache.gpu_memory_utilization",
        ),
        (EngineConfig.from_dict({"scheduler": {"max_num_seqs": 256}}), "scheduler.max_num_seqs"),
        (EngineConfig(compilation=CompilationConfig(custom_ops=[])), "compilation.custom_ops"),
    ],
)
def test_a_default_value_given_explicitly_counts_as_set(config: EngineConfig, path: str) -> None:
    assert path in user_set_fields(config)


def test_assignment_counts_as_set_and_none_or_auto_do_not() -> None:
    config = EngineConfig()
    config.scheduler.max_num_seqs = 256
    config.cache.block_size = None
    config.model.dtype = "auto"
    assert user_set_fields(config) == {"scheduler.max_num_seqs"}


def test_values_filled_while_building_are_not_the_users() -> None:
    with pytest.warns(DeprecationWarning, match="use_cudagraph"):
        compilation = CompilationConfig(use_cudagraph=False)
    config = EngineConfig(scheduler=SchedulerConfig(max_num_seqs=8), compilation=compilation)
    # cuda_graph_sizes and cudagraph_mode were filled by the models themselves
    assert user_set_fields(config) == {"scheduler.max_num_seqs", "compilation.use_cudagraph"}


def test_a_plugin_cannot_replace_an_explicit_default(registered) -> None:
    class Lower:
        @hwplug.hookimpl
        def hwplug_check_and_update_config(self, changes: ChangeLog) -> None:
            changes.record("scheduler.max_num_seqs", 64, "vendor limit")

    registered(Lower(), "lower")
    # left unset: the plugin fills it
    assert hwplug.resolve(platform="h100").config.scheduler.max_num_seqs == 64
    # given, even as the default 256: a ConfigError naming the recorder and both values
    explicit = EngineConfig(scheduler=SchedulerConfig(max_num_seqs=256))
    with pytest.raises(hwplug.ConfigError) as err:
        hwplug.resolve(explicit, platform="h100")
    message = str(err.value)
    assert "lower wants scheduler.max_num_seqs=64" in message
    assert "the user set scheduler.max_num_seqs=256" in message


def test_gpu_memory_utilization_at_its_default_is_still_the_users(registered) -> None:
    class Greedy:
        @hwplug.hookimpl
        def hwplug_check_and_update_config(self, changes: ChangeLog) -> None:
            changes.record("cache.gpu_memory_utilization", 0.95, "use more")

    registered(Greedy(), "greedy")
    with pytest.raises(hwplug.ConfigError, match="cache.gpu_memory_utilization"):
        hwplug.resolve(
            EngineConfig.from_dict({"cache": {"gpu_memory_utilization": 0.9}}), platform="h100"
        )


def test_was_set_answers_the_same_for_one_source_or_two(tmp_path: Path) -> None:
    file = tmp_path / "engine.json"
    file.write_text(json.dumps({"cache": {"block_size": 16}}))
    data = EngineConfig.file_data(file)
    data.setdefault("scheduler", {})["max_num_seqs"] = 256
    two_sources = EngineConfig.from_dict(data)
    one_source = EngineConfig.from_dict(
        {"cache": {"block_size": 16}, "scheduler": {"max_num_seqs": 256}}
    )
    assert user_set_fields(two_sources) == user_set_fields(one_source)
    assert user_set_fields(one_source) == {"cache.block_size", "scheduler.max_num_seqs"}


# --------------------------------------------------------------------------- behind the log


def test_direct_assignment_in_a_hook_is_a_plugin_error(registered) -> None:
    class Sneaky:
        @hwplug.hookimpl
        def hwplug_check_and_update_config(self, config: EngineConfig) -> None:
            config.cache.block_size = 32

    registered(Sneaky(), "sneaky")
    explicit = EngineConfig(cache=CacheConfig(block_size=16))
    with pytest.raises(hwplug.PluginError) as err:
        hwplug.resolve(explicit, platform="h100")
    message = str(err.value)
    assert "'sneaky'" in message and "cache.block_size (16 -> 32)" in message
    assert "changes.record" in message


def test_in_place_mutation_in_a_hook_is_caught_too(registered) -> None:
    class Mutates:
        @hwplug.hookimpl
        def hwplug_check_and_update_config(self, config: EngineConfig) -> None:
            config.compilation.custom_ops.append("+rms_norm")

    registered(Mutates(), "mutates")
    with pytest.raises(hwplug.PluginError, match=r"'mutates'.*compilation\.custom_ops"):
        hwplug.resolve(platform="h100")


def test_in_place_mutation_of_a_nested_section_is_caught(registered) -> None:
    class Nested:
        @hwplug.hookimpl
        def hwplug_check_and_update_config(self, config: EngineConfig) -> None:
            config.compilation.pass_config.dump_graph_stages.append("after_split")

    registered(Nested(), "nested")
    with pytest.raises(hwplug.PluginError, match=r"'nested'.*compilation\.pass_config"):
        hwplug.resolve(platform="h100")


def test_resolving_the_default_config_twice_shares_nothing_mutable(registered) -> None:
    class Mutates:
        @hwplug.hookimpl
        def hwplug_check_and_update_config(self, config: EngineConfig, changes) -> None:
            changes.record("compilation.custom_ops", ["+rms_norm"], "test")

    first = hwplug.resolve(platform="h100")
    first.config.compilation.custom_ops.append("+silu_and_mul")
    first.config.compilation.inductor_compile_config["poisoned"] = True
    registered(Mutates(), "mutates")
    second = hwplug.resolve(platform="h100")
    assert second.config.compilation.custom_ops == ["+rms_norm"]
    assert "poisoned" not in second.config.compilation.inductor_compile_config
    assert second.config == hwplug.resolve(EngineConfig(), platform="h100").config


def test_a_verify_hook_that_changes_the_config_is_a_plugin_error(registered) -> None:
    class Fixer:
        @hwplug.hookimpl
        def hwplug_verify_config(self, config: EngineConfig) -> None:
            config.scheduler.max_num_seqs = 1

    registered(Fixer(), "fixer")
    with pytest.raises(hwplug.PluginError) as err:
        hwplug.resolve(platform="h100")
    message = str(err.value)
    assert "'fixer'" in message
    assert "scheduler.max_num_seqs" in message and "verification must not change" in message


def test_recorded_changes_in_wrappers_and_helpers_pass_the_guard(registered) -> None:
    def helper(changes: ChangeLog) -> None:
        changes.record("scheduler.max_num_seqs", 32, "from a helper")

    class Wrapper:
        @hwplug.hookimpl(wrapper=True)
        def hwplug_check_and_update_config(self, changes: ChangeLog):  # type: ignore[no-untyped-def]
            helper(changes)
            result = yield
            changes.record("scheduler.max_num_batched_tokens", 4096, "after the others")
            return result

    registered(Wrapper(), "wrap")
    resolution = hwplug.resolve(platform="h100")
    sources = {c.path: c.source for c in resolution.changes}
    assert sources["scheduler.max_num_seqs"] == "wrap"
    assert sources["scheduler.max_num_batched_tokens"] == "wrap"


def test_a_failure_inside_a_wrapper_names_the_failing_plugin_not_the_wrapper(registered) -> None:
    class Wrapper:
        @hwplug.hookimpl(wrapper=True)
        def hwplug_check_and_update_config(self):  # type: ignore[no-untyped-def]
            return (yield)

    class Fails:
        @hwplug.hookimpl(tryfirst=True)
        def hwplug_check_and_update_config(self) -> None:
            raise ValueError("boom")

    registered(Fails(), "fails")
    registered(Wrapper(), "wrap")
    with pytest.raises(hwplug.PluginError, match=r"plugin 'fails'.*ValueError: boom"):
        hwplug.resolve(platform="h100")


def test_a_wrapper_that_assigns_after_its_yield_is_named(registered) -> None:
    class Wrapper:
        @hwplug.hookimpl(wrapper=True)
        def hwplug_check_and_update_config(self, config: EngineConfig):  # type: ignore[no-untyped-def]
            result = yield
            config.scheduler.max_num_seqs = 8
            return result

    registered(Wrapper(), "late_wrap")
    with pytest.raises(hwplug.PluginError, match=r"'late_wrap'.*scheduler\.max_num_seqs"):
        hwplug.resolve(platform="h100")


def test_a_platform_that_assigns_behind_the_log_is_named() -> None:
    from hwplug.platforms.cuda import CudaPlatform

    class Careless(CudaPlatform):
        def check_and_update_config(self, config: EngineConfig, changes: ChangeLog) -> None:
            super().check_and_update_config(config, changes)
            config.cache.enable_prefix_caching = False

    platform = Careless.simulate("h100")
    with pytest.raises(hwplug.PluginError, match=r"platform.*cache\.enable_prefix_caching"):
        hwplug.resolve(platform=platform)


def test_a_platform_step_that_raises_is_a_plugin_error_naming_it() -> None:
    from hwplug.platforms.cuda import CudaPlatform

    class Broken(CudaPlatform):
        def check_and_update_config(self, config: EngineConfig, changes: ChangeLog) -> None:
            raise KeyError("oops")

    with pytest.raises(hwplug.PluginError, match=r"platform 'cuda'.*KeyError"):
        hwplug.resolve(platform=Broken.simulate("h100"))


def test_sys_exit_inside_a_hook_is_a_plugin_error(registered) -> None:
    class Exits:
        @hwplug.hookimpl
        def hwplug_check_and_update_config(self) -> None:
            raise SystemExit(3)

    registered(Exits(), "exits")
    with pytest.raises(hwplug.PluginError, match=r"'exits'.*SystemExit"):
        hwplug.resolve(platform="h100")


# --------------------------------------------------------------------------- mirrored fields


def test_an_explicit_cache_window_is_kept() -> None:
    config = EngineConfig(cache=CacheConfig(sliding_window=512))
    resolved = hwplug.resolve(config, platform="h100").config
    assert resolved.cache.sliding_window == 512


def test_the_model_window_fills_an_unset_cache_window() -> None:
    config = EngineConfig(model=ModelConfig(sliding_window=1024))
    resolution = hwplug.resolve(config, platform="h100")
    assert resolution.config.cache.sliding_window == 1024
    [change] = resolution.changes_to("cache.sliding_window")
    assert change.source == "engine"


def test_contradicting_windows_are_a_config_error() -> None:
    config = EngineConfig(
        model=ModelConfig(sliding_window=1024), cache=CacheConfig(sliding_window=512)
    )
    with pytest.raises(
        hwplug.ConfigError, match=r"cache\.sliding_window=512.*model\.sliding_window=1024"
    ):
        hwplug.resolve(config, platform="h100")


def test_explicit_attention_free_cache_flag_is_kept() -> None:
    config = EngineConfig(cache=CacheConfig(is_attention_free=True))
    assert hwplug.resolve(config, platform="h100").config.cache.is_attention_free is True


# --------------------------------------------------------------------------- normalising


def test_user_capture_sizes_are_normalised_without_a_change() -> None:
    config = EngineConfig(compilation=CompilationConfig(cudagraph_capture_sizes=[8, 1, 8, 4]))
    resolution = hwplug.resolve(config, platform="h100")
    assert resolution.config.compilation.cudagraph_capture_sizes == [8, 4, 1]
    assert resolution.changes_to("compilation.cudagraph_capture_sizes") == []


def test_an_explicit_zero_warmups_is_kept() -> None:
    config = EngineConfig(compilation=CompilationConfig(cudagraph_num_of_warmups=0))
    resolved = hwplug.resolve(config, platform="h100").config
    assert resolved.compilation.cudagraph_num_of_warmups == 0
    assert hwplug.resolve(platform="h100").config.compilation.cudagraph_num_of_warmups == 1


def test_a_dict_the_user_gave_may_only_gain_keys() -> None:
    config = EngineConfig(compilation=CompilationConfig(inductor_compile_config={"dce": False}))
    resolved = hwplug.resolve(config, platform="cpu-generic").config
    options = resolved.compilation.inductor_compile_config
    assert options["dce"] is False
    assert options["epilogue_fusion"] is True


def test_capture_sizes_follow_a_max_num_seqs_changed_by_a_plugin(registered) -> None:
    class Small:
        @hwplug.hookimpl
        def hwplug_check_and_update_config(self, changes: ChangeLog) -> None:
            changes.record("scheduler.max_num_seqs", 4, "tiny device")

    registered(Small(), "small")
    resolution = hwplug.resolve(platform="h100")
    assert resolution.config.scheduler.cuda_graph_sizes == [8]
    assert resolution.config.compilation.cudagraph_capture_sizes == [8, 4, 2, 1]
