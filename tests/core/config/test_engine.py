"""EngineConfig: sections, hashing, dicts, files, schema and default capture sizes."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hwplug.core.config import (
    CacheConfig,
    CompilationConfig,
    CUDAGraphMode,
    EngineConfig,
    ModelConfig,
    ParallelConfig,
    PassConfig,
    SchedulerConfig,
)
from hwplug.core.errors import ConfigError

SECTIONS = ("model", "cache", "compilation", "parallel", "scheduler", "attention")
SRC = Path(__file__).resolve().parents[3] / "src"


def rich_config() -> EngineConfig:
    """A config with a non-default value of every kind of field."""
    return EngineConfig(
        model=ModelConfig(dtype="bf16", num_layers=4, use_mla=True),  # type: ignore[arg-type]
        cache=CacheConfig(block_size=32, cache_dtype="fp8", swap_space=1.5),
        compilation=CompilationConfig(
            level=3,
            cudagraph_mode="FULL_AND_PIECEWISE",  # type: ignore[arg-type]
            custom_ops=["none", "+rms_norm"],
            compile_sizes=[1, "cudagraph_capture_sizes"],
            debug_dump_path=Path("/tmp/dump"),
            inductor_passes={"join": "os.path.join"},
            pass_config={"enable_noop": True, "dump_graph_dir": Path("/tmp/g")},  # type: ignore[arg-type]
        ),
        parallel=ParallelConfig(tensor_parallel_size=2, distributed_executor_backend="mp"),
        scheduler=SchedulerConfig(max_num_seqs=64, cuda_graph_sizes=[1, 2, 3]),
    )


# ---------------------------------------------------------------------- structure


def test_every_section_is_defaulted_and_independent() -> None:
    one, two = EngineConfig(), EngineConfig()
    assert one.model == ModelConfig()
    assert one.cache == CacheConfig()
    assert one.compilation == CompilationConfig()
    assert one.parallel == ParallelConfig()
    assert one.scheduler == SchedulerConfig()
    assert one.cache is not two.cache
    assert one.compilation.custom_ops is not two.compilation.custom_ops


def test_sections_can_be_given_as_objects_or_dicts() -> None:
    cache = CacheConfig(block_size=16)
    config = EngineConfig(cache=cache, model={"num_layers": 2})  # type: ignore[arg-type]
    assert config.cache is cache
    assert config.model.num_layers == 2


def test_unknown_section_keyword_lists_the_sections() -> None:
    with pytest.raises(ConfigError, match=r"unknown field.*model, cache, compilation"):
        EngineConfig(caches={})  # type: ignore[call-arg]


def test_equality_and_deep_copies() -> None:
    config = rich_config()
    clone = copy.deepcopy(config)
    assert clone == config
    assert clone is not config
    assert clone.compilation is not config.compilation
    clone.cache.block_size = 64
    assert config.cache.block_size == 32
    assert clone != config
    copied = config.copy()
    assert copied == config
    assert copied.scheduler is not config.scheduler
    assert copy.deepcopy(EngineConfig()) == EngineConfig()


def test_assigning_a_section_validates_it() -> None:
    config = EngineConfig()
    config.cache = {"block_size": 8}  # type: ignore[assignment]
    assert config.cache == CacheConfig(block_size=8)
    with pytest.raises(ValueError, match="block_size"):
        config.cache = {"block_size": 0}  # type: ignore[assignment]
    assert config.cache.block_size == 8


# ---------------------------------------------------------------------- hashing


def test_compute_hash_ignores_per_rank_knobs() -> None:
    base = EngineConfig().compute_hash()
    assert len(base) == 64
    same = EngineConfig(
        cache=CacheConfig(gpu_memory_utilization=0.5, swap_space=0, block_size=32),
        scheduler=SchedulerConfig(max_num_seqs=8),
        compilation=CompilationConfig(cudagraph_capture_sizes=[1, 2]),
        model=ModelConfig(enforce_eager=True),
    )
    assert same.compute_hash() == base


@pytest.mark.parametrize(
    ("section", "changes"),
    [
        ("model", {"num_layers": 2}),
        ("model", {"dtype": "float16"}),
        ("model", {"use_mla": True}),
        ("cache", {"cache_dtype": "fp8"}),
        ("compilation", {"level": 3}),
        ("compilation", {"pass_config": {"enable_async_tp": True}}),
        ("parallel", {"tensor_parallel_size": 2}),
        ("parallel", {"pipeline_parallel_size": 2}),
    ],
)
def test_compute_hash_follows_graph_settings(section: str, changes: dict[str, Any]) -> None:
    assert EngineConfig.from_dict({section: changes}).compute_hash() != (
        EngineConfig().compute_hash()
    )


# ---------------------------------------------------------------------- dicts


def test_to_dict_is_json_ready() -> None:
    data = rich_config().to_dict()
    assert list(data) == list(SECTIONS)
    assert json.loads(json.dumps(data)) == data
    compilation = data["compilation"]
    assert compilation["cudagraph_mode"] == "FULL_AND_PIECEWISE"
    assert compilation["debug_dump_path"] == "/tmp/dump"
    assert compilation["pass_config"]["dump_graph_dir"] == "/tmp/g"
    assert compilation["inductor_compile_config"]["join"] == "posixpath.join"
    assert data["model"]["dtype"] == "bfloat16"


def test_to_dict_leaves_out_derived_fields() -> None:
    config = EngineConfig()
    config.compilation.init_with_cudagraph_sizes([1, 2])
    config.cache.num_gpu_blocks = 10
    data = config.to_dict()
    for name in (
        "max_capture_size",
        "bs_to_padded_graph_size",
        "enabled_custom_ops",
        "static_forward_context",
        "local_cache_dir",
        "traced_files",
        "compilation_time",
    ):
        assert name not in data["compilation"]
    assert "num_gpu_blocks" not in data["cache"]
    assert "swap_space_bytes" not in data["cache"]
    assert "world_size" not in data["parallel"]


def test_callables_are_written_as_qualified_names() -> None:
    config = EngineConfig(compilation=CompilationConfig(inductor_passes={"p": os.path.join}))
    assert config.to_dict()["compilation"]["inductor_passes"] == {"p": "posixpath.join"}


@pytest.mark.parametrize("config", [EngineConfig(), rich_config()], ids=["default", "rich"])
def test_round_trip_through_dicts_and_json(config: EngineConfig) -> None:
    assert EngineConfig.from_dict(config.to_dict()) == config
    assert EngineConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    assert EngineConfig.from_dict(config.to_dict()).compute_hash() == config.compute_hash()


def test_from_dict_accepts_partial_input() -> None:
    config = EngineConfig.from_dict(
        {"cache": {"block_size": 16}, "compilation": {"cudagraph_mode": "piecewise"}}
    )
    assert config.cache.block_size == 16
    assert config.cache.gpu_memory_utilization == 0.9
    assert config.compilation.cudagraph_mode is CUDAGraphMode.PIECEWISE
    assert config.model == ModelConfig()
    assert EngineConfig.from_dict({}) == EngineConfig()


def test_from_dict_unknown_section_lists_the_sections() -> None:
    with pytest.raises(ConfigError) as info:
        EngineConfig.from_dict({"cahce": {}})
    message = str(info.value)
    assert "'cahce'" in message
    assert "did you mean 'cache'" in message
    assert "allowed sections: model, cache, compilation, parallel, scheduler, attention" in message


def test_from_dict_unknown_field_names_section_and_field() -> None:
    with pytest.raises(ConfigError) as info:
        EngineConfig.from_dict({"scheduler": {"max_num_seq": 4}})
    message = str(info.value)
    assert "scheduler.max_num_seq: unknown field" in message
    assert "did you mean 'max_num_seqs'" in message
    assert "max_num_batched_tokens" in message


def test_from_dict_derived_fields_are_not_accepted() -> None:
    with pytest.raises(ConfigError, match=r"compilation\.max_capture_size: unknown field"):
        EngineConfig.from_dict({"compilation": {"max_capture_size": 4}})


@pytest.mark.parametrize("body", [3, "fast", [1, 2], None, True])
def test_from_dict_section_must_be_a_dict(body: object) -> None:
    with pytest.raises(ConfigError, match=r"section 'cache' must be a dict"):
        EngineConfig.from_dict({"cache": body})


@pytest.mark.parametrize("data", [[], "cache", None, 3])
def test_from_dict_needs_a_dict(data: object) -> None:
    with pytest.raises(ConfigError, match="dict of sections"):
        EngineConfig.from_dict(data)  # type: ignore[arg-type]


def test_from_dict_field_names_must_be_strings() -> None:
    with pytest.raises(ConfigError, match=r"cache: field names must be strings"):
        EngineConfig.from_dict({"cache": {1: 2}})


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"cache": {"block_size": 0}}, "cache.block_size: Input should be greater than"),
        ({"cache": {"cache_dtype": "fp4"}}, "cache.cache_dtype: Input should be 'auto'"),
        ({"model": {"num_kv_heads": 3}}, "model.num_kv_heads (3)"),
        ({"parallel": {"tensor_parallel_size": "two"}}, "parallel.tensor_parallel_size:"),
        ({"compilation": {"level": 9}}, "compilation.level: invalid level 9"),
        ({"compilation": {"custom_ops": ["x"]}}, "compilation.custom_ops: invalid entry"),
        (
            {"compilation": {"pass_config": {"enable_noop": []}}},
            "compilation.pass_config.enable_noop:",
        ),
        ({"compilation": {"pass_config": {"noop": True}}}, "compilation.pass_config.noop:"),
        ({"scheduler": {"cuda_graph_sizes": [4, -1]}}, "scheduler.cuda_graph_sizes[1]:"),
    ],
)
def test_from_dict_value_errors_name_the_field_path(data: dict[str, Any], expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        EngineConfig.from_dict(data)
    assert expected in str(info.value)


def test_from_dict_reports_every_bad_field_of_a_section() -> None:
    with pytest.raises(ConfigError) as info:
        EngineConfig.from_dict({"cache": {"block_size": -1, "swap_space": -1}})
    assert "cache.block_size" in str(info.value)
    assert "cache.swap_space" in str(info.value)


def test_from_dict_copies_section_objects() -> None:
    cache = CacheConfig(block_size=8)
    config = EngineConfig.from_dict({"cache": cache})
    assert config.cache == cache
    assert config.cache is not cache


# ---------------------------------------------------------------------- files

FILE_BODIES = {
    ".json": '{"cache": {"block_size": 32}, "compilation": {"level": 3}}',
    ".yaml": "cache:\n  block_size: 32\ncompilation:\n  level: 3\n",
    ".yml": "cache: {block_size: 32}\ncompilation: {level: 3}\n",
    ".toml": "[cache]\nblock_size = 32\n\n[compilation]\nlevel = 3\n",
}


@pytest.mark.parametrize("suffix", list(FILE_BODIES))
@pytest.mark.parametrize("as_str", [False, True])
def test_from_file_reads_partial_configs(tmp_path: Path, suffix: str, as_str: bool) -> None:
    path = tmp_path / f"engine{suffix}"
    path.write_text(FILE_BODIES[suffix])
    config = EngineConfig.from_file(str(path) if as_str else path)
    assert config == EngineConfig.from_dict(
        {"cache": {"block_size": 32}, "compilation": {"level": 3}}
    )


def test_from_file_suffix_is_case_insensitive(tmp_path: Path) -> None:
    path = tmp_path / "engine.JSON"
    path.write_text("{}")
    assert EngineConfig.from_file(path) == EngineConfig()


def test_empty_yaml_file_means_defaults(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("# nothing set\n")
    assert EngineConfig.from_file(path) == EngineConfig()


def test_from_file_round_trips_to_dict(tmp_path: Path) -> None:
    config = rich_config()
    path = tmp_path / "engine.json"
    path.write_text(json.dumps(config.to_dict()))
    assert EngineConfig.from_file(path) == config


def test_missing_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "nowhere.yaml"
    with pytest.raises(ConfigError, match=r"nowhere\.yaml: cannot read config file"):
        EngineConfig.from_file(path)


def test_unreadable_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "dir.json"
    path.mkdir()
    with pytest.raises(ConfigError, match=r"dir\.json: cannot read config file"):
        EngineConfig.from_file(path)


def test_unsupported_extension_lists_the_supported_ones(tmp_path: Path) -> None:
    path = tmp_path / "engine.ini"
    path.write_text("[cache]\n")
    with pytest.raises(ConfigError) as info:
        EngineConfig.from_file(path)
    message = str(info.value)
    assert "engine.ini" in message
    assert "'.ini'" in message
    assert ".json, .yaml, .yml, .toml" in message


@pytest.mark.parametrize(
    ("suffix", "body", "expected"),
    [
        (".json", '{\n  "cache": {\n    "block_size": 16,\n  }\n}', "line 4"),
        (".yaml", "cache:\n  block_size: 16\n   bad: [\n", "line 3"),
        (".toml", "[cache]\nblock_size = = 16\n", "line 2"),
    ],
)
def test_malformed_files_name_the_file_and_line(
    tmp_path: Path, suffix: str, body: str, expected: str
) -> None:
    path = tmp_path / f"broken{suffix}"
    path.write_text(body)
    with pytest.raises(ConfigError) as info:
        EngineConfig.from_file(path)
    message = str(info.value)
    assert f"broken{suffix}" in message
    assert "malformed" in message
    assert expected in message


@pytest.mark.parametrize(("suffix", "body"), [(".json", "[1, 2]"), (".yaml", "- cache\n")])
def test_top_level_must_be_a_mapping(tmp_path: Path, suffix: str, body: str) -> None:
    path = tmp_path / f"list{suffix}"
    path.write_text(body)
    with pytest.raises(ConfigError, match=r"list\.(json|yaml): expected a mapping of sections"):
        EngineConfig.from_file(path)


def test_invalid_values_in_files_name_file_and_field(tmp_path: Path) -> None:
    path = tmp_path / "engine.toml"
    path.write_text('[cache]\ncache_dtype = "fp4"\n')
    with pytest.raises(ConfigError, match=r"engine\.toml: cache\.cache_dtype: Input should be"):
        EngineConfig.from_file(path)


# ---------------------------------------------------------------------- schema


def test_json_schema_describes_the_sections() -> None:
    schema = EngineConfig.json_schema()
    json.dumps(schema)
    assert set(schema["properties"]) == set(SECTIONS)
    defs = schema["$defs"]
    cache = defs["CacheConfig"]
    assert cache["additionalProperties"] is False
    assert set(cache["properties"]) == set(CacheConfig.init_field_names())
    assert cache["properties"]["cache_dtype"]["enum"] == [
        "auto",
        "bfloat16",
        "fp8",
        "fp8_e4m3",
        "fp8_e5m2",
        "fp8_inc",
    ]
    assert "description" in cache["properties"]["block_size"]
    compilation = defs["CompilationConfig"]["properties"]
    assert set(compilation) == set(CompilationConfig.init_field_names())
    assert "FULL_AND_PIECEWISE" in json.dumps(compilation["cudagraph_mode"])
    assert set(defs["PassConfig"]["properties"]) == set(PassConfig.init_field_names())


# ---------------------------------------------------------------------- capture sizes


def capture_sizes(**sections: dict[str, Any]) -> list[int]:
    return EngineConfig.from_dict(sections).default_cudagraph_capture_sizes()


def test_default_capture_sizes_for_512() -> None:
    sizes = capture_sizes()
    assert len(sizes) == 67
    assert sizes[:6] == [1, 2, 4, 8, 16, 24]
    assert sizes[-1] == 512
    assert sizes == [1, 2, 4, *range(8, 513, 8)]


@pytest.mark.parametrize(
    ("bound", "expected"),
    [(1, [1]), (2, [1, 2]), (3, [1, 2]), (7, [1, 2, 4]), (8, [1, 2, 4, 8]), (20, [1, 2, 4, 8, 16])],
)
def test_a_single_value_expands(bound: int, expected: list[int]) -> None:
    assert capture_sizes(scheduler={"cuda_graph_sizes": [bound]}) == expected


def test_unset_sizes_follow_max_num_seqs() -> None:
    assert capture_sizes(scheduler={"max_num_seqs": 8}) == [1, 2, 4, 8, 16]
    config = EngineConfig()
    config.scheduler.cuda_graph_sizes = []
    assert len(config.default_cudagraph_capture_sizes()) == 67


def test_several_values_are_used_as_given() -> None:
    assert capture_sizes(scheduler={"cuda_graph_sizes": [48, 3, 3, 1000]}) == [3, 48, 1000]


def test_sizes_above_the_token_budget_are_dropped() -> None:
    assert capture_sizes(scheduler={"max_num_batched_tokens": 20}) == [1, 2, 4, 8, 16]
    assert capture_sizes(
        scheduler={"max_num_batched_tokens": 100, "cuda_graph_sizes": [100, 101, 5]}
    ) == [5, 100]


def test_sequence_parallelism_keeps_sizes_divisible_by_tp() -> None:
    sp = {"pass_config": {"enable_sequence_parallelism": True}}
    sizes = capture_sizes(parallel={"tensor_parallel_size": 4}, compilation=sp)
    assert sizes == [4, *range(8, 513, 8)]
    assert capture_sizes(parallel={"tensor_parallel_size": 3}, compilation=sp)[:3] == [24, 48, 72]
    assert len(capture_sizes(parallel={"tensor_parallel_size": 4})) == 67
    assert capture_sizes(compilation=sp) == capture_sizes()


# ---------------------------------------------------------------------- import cost


def test_importing_the_config_package_does_not_import_torch() -> None:
    code = (
        "import sys\n"
        "from hwplug.core.config import EngineConfig, CompilationConfig\n"
        "EngineConfig().compute_hash()\n"
        "passes = {'p': 'os.path.join'}\n"
        "EngineConfig.from_dict({'compilation': {'level': 3, 'inductor_passes': passes}})\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
