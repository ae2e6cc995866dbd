"""hwplug.resolve(): the pipeline, change attribution, determinism."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

import hwplug
from hwplug.core.config import (
    CacheConfig,
    CompilationConfig,
    CUDAGraphMode,
    EngineConfig,
    ModelConfig,
    SchedulerConfig,
)
from hwplug.core.resolve import ChangeLog, user_set_fields
from hwplug.plugins import manager


@contextmanager
def registered(plugin: object, name: str) -> Iterator[None]:
    pm = manager.get_plugin_manager()
    pm.register(plugin, name=name)
    try:
        yield
    finally:
        pm.unregister(name=name)


def by_path(resolution: hwplug.Resolution) -> dict[str, hwplug.Change]:
    return {c.path: c for c in resolution.changes}


def test_caller_config_is_never_mutated() -> None:
    config = EngineConfig()
    before = config.to_dict()
    resolution = hwplug.resolve(config, platform="h100")
    assert config.to_dict() == before
    assert resolution.config is not config
    assert config.cache.block_size is None


def test_resolution_is_deterministic() -> None:
    config = EngineConfig(cache=CacheConfig(cache_dtype="fp8"))
    first = hwplug.resolve(config, platform="h100")
    second = hwplug.resolve(config, platform="h100")
    assert first.config.to_dict() == second.config.to_dict()
    assert first.config.compute_hash() == second.config.compute_hash()
    assert [c.to_dict() for c in first.changes] == [c.to_dict() for c in second.changes]


def test_default_config_on_h100_changes_and_sources() -> None:
    resolution = hwplug.resolve(platform="h100")
    changes = by_path(resolution)
    assert changes["compilation.level"].new == 3
    assert changes["compilation.level"].source == "engine"
    assert changes["compilation.cudagraph_mode"].new == CUDAGraphMode.FULL_AND_PIECEWISE
    assert changes["cache.block_size"].new == 16
    assert changes["cache.block_size"].source == "platform:cuda"
    assert changes["model.dtype"].new == "bfloat16"
    assert changes["compilation.cudagraph_num_of_warmups"].new == 1
    sizes = resolution.config.compilation.cudagraph_capture_sizes
    assert len(sizes) == 67 and sizes[0] == 512 and sizes[-1] == 1
    assert resolution.config.compilation.max_capture_size == 512
    assert resolution.config.compilation.bs_to_padded_graph_size[3] == 4
    assert resolution.config.compilation.splitting_ops == [
        *CompilationConfig._attention_ops,
        "hwplug.unified_attention",
        "hwplug.unified_attention_with_output",
    ]
    assert resolution.config.attention.backend == "triton"
    assert all(c.reason for c in resolution.changes)


def test_model_facts_are_mirrored_into_the_cache() -> None:
    config = EngineConfig(model=ModelConfig(sliding_window=4096))
    resolution = hwplug.resolve(config, platform="h100")
    assert resolution.config.cache.sliding_window == 4096
    change = by_path(resolution)["cache.sliding_window"]
    assert (change.old, change.new, change.source) == (None, 4096, "engine")


def test_enforce_eager_turns_compilation_and_graphs_off() -> None:
    config = EngineConfig(model=ModelConfig(enforce_eager=True))
    resolved = hwplug.resolve(config, platform="h100").config
    assert resolved.compilation.level == 0
    assert resolved.compilation.cudagraph_mode == CUDAGraphMode.NONE
    assert resolved.compilation.cudagraph_capture_sizes == []
    assert resolved.compilation.max_capture_size == 0
    assert resolved.compilation.cudagraph_num_of_warmups == 0


def test_enforce_eager_with_explicit_graph_mode_is_an_error() -> None:
    config = EngineConfig(
        model=ModelConfig(enforce_eager=True),
        compilation=CompilationConfig(cudagraph_mode="FULL"),
    )
    with pytest.raises(hwplug.ConfigError, match="model.enforce_eager") as err:
        hwplug.resolve(config, platform="h100")
    assert "compilation.cudagraph_mode" in str(err.value)


def test_explicit_graph_mode_on_a_platform_without_graphs_is_an_error() -> None:
    config = EngineConfig(compilation=CompilationConfig(cudagraph_mode="PIECEWISE"))
    with pytest.raises(hwplug.ConfigError, match="no device graphs") as err:
        hwplug.resolve(config, platform="cpu-generic")
    assert "compilation.cudagraph_mode=PIECEWISE" in str(err.value)


def test_piecewise_mode_needs_piecewise_level() -> None:
    config = EngineConfig(compilation=CompilationConfig(level=2, cudagraph_mode="PIECEWISE"))
    with pytest.raises(hwplug.ConfigError, match="needs piecewise compilation"):
        hwplug.resolve(config, platform="h100")


def test_unset_mode_at_level_two_is_none_on_cuda() -> None:
    config = EngineConfig(compilation=CompilationConfig(level=2))
    resolved = hwplug.resolve(config, platform="h100").config
    assert resolved.compilation.cudagraph_mode == CUDAGraphMode.NONE
    assert resolved.compilation.cudagraph_capture_sizes == []


def test_explicit_piecewise_with_explicit_empty_splitting_ops_is_an_error() -> None:
    config = EngineConfig(
        compilation=CompilationConfig(level=3, cudagraph_mode="PIECEWISE", splitting_ops=[])
    )
    with pytest.raises(hwplug.ConfigError, match="compilation.cudagraph_mode=PIECEWISE"):
        hwplug.resolve(config, platform="h100")


def test_unset_mode_with_empty_splitting_ops_becomes_full_and_is_recorded() -> None:
    config = EngineConfig(compilation=CompilationConfig(splitting_ops=[]))
    resolution = hwplug.resolve(config, platform="h100")
    assert resolution.config.compilation.cudagraph_mode == CUDAGraphMode.FULL
    modes = resolution.changes_to("compilation.cudagraph_mode")
    assert [c.new for c in modes] == [CUDAGraphMode.FULL_AND_PIECEWISE, CUDAGraphMode.FULL]


def test_explicit_splitting_ops_with_graph_partition_is_an_error() -> None:
    config = EngineConfig(
        compilation=CompilationConfig(
            splitting_ops=["vllm.unified_attention"], use_inductor_graph_partition=True
        )
    )
    with pytest.raises(hwplug.ConfigError, match="use_inductor_graph_partition"):
        hwplug.resolve(config, platform="h100")


def test_user_capture_sizes_are_kept_sorted_and_deduplicated() -> None:
    config = EngineConfig(compilation=CompilationConfig(cudagraph_capture_sizes=[4, 1, 4, 2]))
    resolved = hwplug.resolve(config, platform="h100").config
    assert resolved.compilation.cudagraph_capture_sizes == [4, 2, 1]
    on_cpu = hwplug.resolve(config, platform="cpu-generic").config
    assert on_cpu.compilation.cudagraph_capture_sizes == [4, 2, 1]


def test_capture_sizes_respect_max_num_batched_tokens() -> None:
    config = EngineConfig(scheduler=SchedulerConfig(max_num_batched_tokens=100, max_num_seqs=64))
    sizes = hwplug.resolve(config, platform="h100").config.compilation.cudagraph_capture_sizes
    assert max(sizes) == 96


def test_user_set_fields_tells_choices_from_defaults() -> None:
    config = EngineConfig(cache=CacheConfig(block_size=32, cache_dtype="auto"))
    user_set = user_set_fields(config)
    assert "cache.block_size" in user_set
    assert "cache.cache_dtype" not in user_set
    assert "compilation.level" not in user_set


class Extension:
    @hwplug.hookimpl
    def hwplug_check_and_update_config(self, config: EngineConfig, changes: ChangeLog) -> None:
        if not changes.was_set("scheduler.max_num_seqs"):
            changes.record("scheduler.max_num_seqs", 64, "vendor batch limit")


def test_hook_changes_are_attributed_to_the_plugin() -> None:
    with registered(Extension(), "acme-tuning"):
        resolution = hwplug.resolve(platform="h100")
    change = by_path(resolution)["scheduler.max_num_seqs"]
    assert (change.old, change.new, change.source) == (256, 64, "acme-tuning")
    assert change.reason == "vendor batch limit"


def test_hook_ordering_and_wrappers_are_attributed() -> None:
    class Late:
        @hwplug.hookimpl(trylast=True)
        def hwplug_check_and_update_config(self, changes: ChangeLog) -> None:
            changes.record("scheduler.max_num_seqs", 32, "late")

    class Early:
        @hwplug.hookimpl(tryfirst=True)
        def hwplug_check_and_update_config(self, changes: ChangeLog) -> None:
            changes.record("scheduler.max_num_seqs", 48, "early")

    class Wrapper:
        @hwplug.hookimpl(wrapper=True)
        def hwplug_check_and_update_config(self, changes: ChangeLog):  # type: ignore[no-untyped-def]
            result = yield
            changes.record("scheduler.max_num_batched_tokens", 4096, "after the others")
            return result

    with registered(Late(), "late"), registered(Early(), "early"), registered(Wrapper(), "wrap"):
        resolution = hwplug.resolve(platform="h100")
    seqs = resolution.changes_to("scheduler.max_num_seqs")
    assert [(c.source, c.new) for c in seqs] == [("early", 48), ("late", 32)]
    [tokens] = resolution.changes_to("scheduler.max_num_batched_tokens")
    assert tokens.source == "wrap"


def test_explicit_source_wins() -> None:
    class Named:
        @hwplug.hookimpl
        def hwplug_check_and_update_config(self, changes: ChangeLog) -> None:
            changes.record("scheduler.max_num_seqs", 8, "tuned", source="acme:tuner")

    with registered(Named(), "named"):
        resolution = hwplug.resolve(platform="h100")
    assert by_path(resolution)["scheduler.max_num_seqs"].source == "acme:tuner"


def test_bad_change_path_lists_fields() -> None:
    class BadPath:
        @hwplug.hookimpl
        def hwplug_check_and_update_config(self, changes: ChangeLog) -> None:
            changes.record("cache.blocksize", 16, "typo")

    with registered(BadPath(), "badpath"), pytest.raises(hwplug.ConfigError) as err:
        hwplug.resolve(platform="h100")
    assert "cache has no field 'blocksize'" in str(err.value)
    assert "block_size" in str(err.value)


def test_invalid_change_value_names_the_plugin_and_field() -> None:
    class BadValue:
        @hwplug.hookimpl
        def hwplug_check_and_update_config(self, changes: ChangeLog) -> None:
            changes.record("cache.cache_dtype", "fp4", "why not")

    with registered(BadValue(), "badvalue"), pytest.raises(hwplug.ConfigError) as err:
        hwplug.resolve(platform="h100")
    assert "badvalue set cache.cache_dtype to 'fp4'" in str(err.value)


def test_a_hook_that_crashes_is_a_plugin_error_naming_it() -> None:
    class Crashes:
        @hwplug.hookimpl
        def hwplug_check_and_update_config(self, config: EngineConfig) -> None:
            raise KeyError("oops")

    with registered(Crashes(), "crashes"), pytest.raises(hwplug.PluginError) as err:
        hwplug.resolve(platform="h100")
    assert "'crashes'" in str(err.value) and "KeyError" in str(err.value)


def test_verify_hook_has_the_last_word() -> None:
    class Veto:
        @hwplug.hookimpl
        def hwplug_verify_config(self, config: EngineConfig, platform: object) -> None:
            if config.cache.block_size == 16:
                raise hwplug.ConfigError("cache.block_size=16 is banned by veto; use 32")

    with registered(Veto(), "veto"):
        with pytest.raises(hwplug.ConfigError, match="banned by veto"):
            hwplug.resolve(platform="h100")
        ok = hwplug.resolve(EngineConfig(cache=CacheConfig(block_size=32)), platform="h100")
    assert ok.config.cache.block_size == 32


def test_explain_and_to_dict() -> None:
    resolution = hwplug.resolve(platform="h100")
    text = resolution.explain()
    assert "cuda" in text and "NVIDIA H100" in text and "simulated h100" in text
    assert "cache.block_size" in text and "[platform:cuda]" in text
    data = resolution.to_dict()
    assert set(data) == {"platform", "config", "changes"}
    assert data["platform"] == "cuda"
    assert set(data["changes"][0]) == {"path", "old", "new", "source", "reason"}


def test_explain_never_prints_a_change_as_old_equal_to_new() -> None:
    """A long list that grows at its end (splitting_ops on a piecewise CUDA config) must
    not read as the same value before and after: explain() says what was added."""
    resolution = hwplug.resolve(platform="h100")
    lines = [line for line in resolution.explain().splitlines() if " -> " in line]
    assert any("compilation.splitting_ops" in line for line in lines)
    for line in lines:
        before, _, after = line.split("  ", 2)[-1].partition(" -> ")
        assert before.strip() != after.split("  [")[0].strip(), line
    grown = [
        c
        for c in resolution.changes
        if c.path == "compilation.splitting_ops" and c.old and len(c.new) > len(c.old)
    ]
    assert grown, "expected splitting_ops to grow on h100"
    added = [op for op in grown[0].new if op not in grown[0].old]
    text = resolution.explain()
    for op in added:
        assert f'+"{op}"' in text


def test_resolve_rejects_non_configs() -> None:
    with pytest.raises(hwplug.ConfigError, match="expects an EngineConfig"):
        hwplug.resolve({"cache": {}})  # type: ignore[arg-type]


def test_resolve_uses_the_current_platform_by_default() -> None:
    with hwplug.use_platform("mi300x"):
        assert hwplug.resolve().platform.name == "rocm"


def test_defaults_filled_after_construction_are_not_user_choices() -> None:
    assert user_set_fields(EngineConfig()) == frozenset()
    config = EngineConfig(
        scheduler=SchedulerConfig(max_num_seqs=100),
        compilation=CompilationConfig(inductor_passes={"join": "os.path.join"}),
    )
    assert user_set_fields(config) == {"scheduler.max_num_seqs", "compilation.inductor_passes"}
    explicit = EngineConfig(
        scheduler=SchedulerConfig(cuda_graph_sizes=[8]),
        compilation=CompilationConfig(inductor_compile_config={"max_autotune": True}),
    )
    assert user_set_fields(explicit) == {
        "scheduler.cuda_graph_sizes",
        "compilation.inductor_compile_config",
    }
