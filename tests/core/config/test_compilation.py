"""CompilationConfig: fields, parsing, migrations, passes, hashing and the seed's methods."""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import logging
import os.path
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

import hwplug
from hwplug.core import versions
from hwplug.core.config import (
    CallableInductorPass,
    CompilationConfig,
    CompilationLevel,
    CUDAGraphMode,
    EngineConfig,
    PassConfig,
    _common,
    compilation,
)
from hwplug.core.errors import ConfigError

M = CUDAGraphMode

ATTENTION_OPS = [
    "vllm.unified_attention",
    "vllm.unified_attention_with_output",
    "vllm.mamba_mixer2",
    "vllm.mamba_mixer",
    "vllm.short_conv",
    "vllm.linear_attention",
    "vllm.plamo2_mamba_mixer",
    "vllm.gdn_attention",
    "vllm.sparse_attn_indexer",
]


def graph_pass(graph: Any) -> Any:
    """A module-level inductor pass for the tests."""
    return ("passed", graph)


class PassWithUuid:
    """A pass object that already identifies itself."""

    def __call__(self, graph: Any) -> None:
        return None

    def uuid(self) -> str:
        return "fixed"


@pytest.fixture
def old_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pretend torch 2.5 is installed."""
    monkeypatch.setattr(versions, "torch_version", lambda: (2, 5, 1))


# ---------------------------------------------------------------------- fields


def test_defaults_match_the_seed() -> None:
    config = CompilationConfig()
    expected: dict[str, Any] = {
        "level": None,
        "debug_dump_path": None,
        "cache_dir": "",
        "backend": "",
        "custom_ops": [],
        "splitting_ops": None,
        "use_inductor": True,
        "compile_sizes": None,
        "inductor_passes": {},
        "cudagraph_mode": None,
        "use_cudagraph": True,
        "cudagraph_num_of_warmups": 0,
        "cudagraph_capture_sizes": None,
        "cudagraph_copy_inputs": False,
        "full_cuda_graph": False,
        "use_inductor_graph_partition": False,
        "pass_config": PassConfig(),
        "max_capture_size": None,
        "local_cache_dir": None,
        "bs_to_padded_graph_size": None,
        "enabled_custom_ops": collections.Counter(),
        "disabled_custom_ops": collections.Counter(),
        "traced_files": set(),
        "compilation_time": 0.0,
        "static_forward_context": {},
    }
    for name, value in expected.items():
        assert getattr(config, name) == value, name
    assert isinstance(config.enabled_custom_ops, collections.Counter)
    assert isinstance(config.disabled_custom_ops, collections.Counter)


def test_derived_fields_are_not_constructor_arguments() -> None:
    init = {f.name for f in dataclasses.fields(CompilationConfig) if f.init}
    derived = {f.name for f in dataclasses.fields(CompilationConfig) if not f.init}
    assert derived == {
        "max_capture_size",
        "local_cache_dir",
        "bs_to_padded_graph_size",
        "enabled_custom_ops",
        "disabled_custom_ops",
        "traced_files",
        "compilation_time",
        "static_forward_context",
    }
    assert "pass_config" in init
    with pytest.raises(ConfigError, match=r"compilation\.max_capture_size: unknown field"):
        CompilationConfig(max_capture_size=8)  # type: ignore[call-arg]


def test_attention_ops_are_the_seed_list() -> None:
    assert CompilationConfig._attention_ops == ATTENTION_OPS


# ---------------------------------------------------------------------- level


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, None), (0, 0), (3, 3), (CompilationLevel.DYNAMO_ONCE, 2), ("1", 1), ("piecewise", 3)],
)
def test_level_accepts_0_to_3(value: object, expected: int | None) -> None:
    level = CompilationConfig(level=value).level  # type: ignore[arg-type]
    assert level == expected
    assert type(level) is type(expected)


@pytest.mark.parametrize("value", [4, -1, True, "fast", 2.5])
def test_bad_level_lists_the_levels(value: object) -> None:
    with pytest.raises(ConfigError) as info:
        CompilationConfig(level=value)  # type: ignore[arg-type]
    message = str(info.value)
    assert "compilation.level" in message
    for name in ("NO_COMPILATION", "DYNAMO_AS_IS", "DYNAMO_ONCE", "PIECEWISE"):
        assert name in message


# ---------------------------------------------------------------------- cudagraph_mode


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("piecewise", M.PIECEWISE),
        ("FULL_decode_ONLY", M.FULL_DECODE_ONLY),
        (2, M.FULL),
        ((2, 1), M.FULL_AND_PIECEWISE),
        ([2, 0], M.FULL_DECODE_ONLY),
        (M.NONE, M.NONE),
    ],
)
def test_cudagraph_mode_is_parsed_from_names_and_values(
    value: object, expected: CUDAGraphMode
) -> None:
    assert CompilationConfig(cudagraph_mode=value).cudagraph_mode is expected  # type: ignore[arg-type]
    config = CompilationConfig()
    config.cudagraph_mode = value  # type: ignore[assignment]
    assert config.cudagraph_mode is expected


def test_unknown_cudagraph_mode_lists_the_modes() -> None:
    with pytest.raises(ConfigError, match=r"compilation\.cudagraph_mode.*FULL_AND_PIECEWISE"):
        CompilationConfig(cudagraph_mode="sometimes")  # type: ignore[arg-type]
    config = CompilationConfig(cudagraph_mode="full")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="FULL_DECODE_ONLY"):
        config.cudagraph_mode = 9  # type: ignore[assignment]
    assert config.cudagraph_mode is M.FULL


# ---------------------------------------------------------------------- custom ops


@pytest.mark.parametrize(
    "ops", [[], ["all"], ["none"], ["all", "-rms_norm"], ["none", "+rms_norm", "+silu"], ["-x"]]
)
def test_valid_custom_ops(ops: list[str]) -> None:
    assert CompilationConfig(custom_ops=ops).custom_ops == ops


@pytest.mark.parametrize(
    "ops", [["all", "none"], ["none", "all"], ["all", "all"], ["none", "+a", "none"]]
)
def test_all_and_none_at_most_once_in_total(ops: list[str]) -> None:
    with pytest.raises(ConfigError, match=r"compilation\.custom_ops.*at most once"):
        CompilationConfig(custom_ops=ops)


@pytest.mark.parametrize("entry", ["rms_norm", "", "+", "-", "All", "*op"])
def test_custom_op_entries_need_a_sign(entry: str) -> None:
    with pytest.raises(ConfigError) as info:
        CompilationConfig(custom_ops=["all", entry])
    message = str(info.value)
    assert "compilation.custom_ops" in message
    assert repr(entry) in message
    assert "'+op'" in message
    assert "'-op'" in message


def test_custom_ops_assignment_is_validated() -> None:
    config = CompilationConfig(custom_ops=["all"])
    with pytest.raises(ConfigError, match="at most once"):
        config.custom_ops = ["all", "none"]
    assert config.custom_ops == ["all"]


# ---------------------------------------------------------------------- deprecated flags


def test_use_cudagraph_false_migrates_to_none() -> None:
    with pytest.warns(DeprecationWarning, match="use_cudagraph"):
        config = CompilationConfig(use_cudagraph=False)
    assert config.cudagraph_mode is M.NONE
    with pytest.warns(DeprecationWarning, match="use_cudagraph"):
        assert CompilationConfig(use_cudagraph=False, cudagraph_mode="NONE").cudagraph_mode is (  # type: ignore[arg-type]
            M.NONE
        )


def test_use_cudagraph_false_with_a_graph_mode_is_an_error() -> None:
    with (
        pytest.warns(DeprecationWarning, match="use_cudagraph"),
        pytest.raises(ConfigError, match=r"use_cudagraph.*cudagraph_mode.*mutually exclusive"),
    ):
        CompilationConfig(use_cudagraph=False, cudagraph_mode="PIECEWISE")  # type: ignore[arg-type]


def test_full_cuda_graph_migrates_to_full() -> None:
    with pytest.warns(DeprecationWarning, match="full_cuda_graph"):
        assert CompilationConfig(full_cuda_graph=True).cudagraph_mode is M.FULL
    with pytest.warns(DeprecationWarning, match="full_cuda_graph"):
        config = CompilationConfig(full_cuda_graph=True, cudagraph_mode="FULL_DECODE_ONLY")  # type: ignore[arg-type]
    assert config.cudagraph_mode is M.FULL


@pytest.mark.parametrize("mode", ["NONE", "PIECEWISE"])
def test_full_cuda_graph_with_a_mode_without_full_graphs_is_an_error(mode: str) -> None:
    with (
        pytest.warns(DeprecationWarning, match="full_cuda_graph"),
        pytest.raises(ConfigError, match=r"full_cuda_graph.*cudagraph_mode.*mutually exclusive"),
    ):
        CompilationConfig(full_cuda_graph=True, cudagraph_mode=mode)  # type: ignore[arg-type]


def test_both_deprecated_flags_contradict_each_other() -> None:
    with (
        pytest.warns(DeprecationWarning, match="deprecated"),
        pytest.raises(ConfigError, match="full_cuda_graph"),
    ):
        CompilationConfig(use_cudagraph=False, full_cuda_graph=True)


def test_deprecations_are_also_logged(caplog: pytest.LogCaptureFixture) -> None:
    with (
        caplog.at_level(logging.WARNING, logger="hwplug.config"),
        pytest.warns(DeprecationWarning, match="use_cudagraph"),
    ):
        CompilationConfig(use_cudagraph=False)
    assert any("deprecated" in r.getMessage() for r in caplog.records)


# ---------------------------------------------------------------------- pass config


def test_pass_config_from_a_dict() -> None:
    config = CompilationConfig(pass_config={"enable_fusion": True, "enable_noop": True})  # type: ignore[arg-type]
    assert isinstance(config.pass_config, PassConfig)
    assert config.pass_config.enable_fusion
    config.pass_config = {"enable_async_tp": True}  # type: ignore[assignment]
    assert config.pass_config == PassConfig(enable_async_tp=True)


def test_pass_config_errors_name_the_nested_field() -> None:
    with pytest.raises(ConfigError, match=r"compilation\.pass_config\.fusion: unknown field"):
        CompilationConfig(pass_config={"fusion": True})  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match=r"pass_config\.enable_noop"):
        CompilationConfig(pass_config={"enable_noop": "perhaps"})  # type: ignore[arg-type]


# ---------------------------------------------------------------------- inductor passes


def test_callable_passes_are_wrapped_into_the_inductor_config() -> None:
    config = CompilationConfig(inductor_passes={"mine": graph_pass})
    wrapped = config.inductor_compile_config["mine"]
    assert isinstance(wrapped, CallableInductorPass)
    assert wrapped("g") == ("passed", "g")
    assert wrapped.qualified_name == f"{__name__}.graph_pass"
    assert config.inductor_passes["mine"] is graph_pass


@pytest.mark.parametrize(
    ("name", "target"),
    [
        ("os.path.join", os.path.join),
        ("collections.OrderedDict.fromkeys", collections.OrderedDict.fromkeys),
        (f"{__name__}.graph_pass", graph_pass),
    ],
)
def test_qualified_names_are_imported(name: str, target: Any) -> None:
    config = CompilationConfig(inductor_passes={"p": name})
    wrapped = config.inductor_compile_config["p"]
    assert isinstance(wrapped, CallableInductorPass)
    assert wrapped.func == target
    assert config.inductor_passes == {"p": name}


def test_objects_that_are_passes_already_are_kept() -> None:
    pass_object = PassWithUuid()
    config = CompilationConfig(inductor_passes={"p": pass_object})
    assert config.inductor_compile_config["p"] is pass_object


@pytest.mark.parametrize(
    "name",
    ["nosuchmodule_hwplug.fn", "os.path.no_such_function", "not a name", "", "os.sep"],
)
def test_unresolvable_pass_names_the_pass_and_the_name(name: str) -> None:
    with pytest.raises(ConfigError) as info:
        CompilationConfig(inductor_passes={"my_pass": name})
    message = str(info.value)
    assert "compilation.inductor_passes['my_pass']" in message
    assert repr(name) in message


def test_pass_values_must_be_names_or_callables() -> None:
    with pytest.raises(ValidationError, match="inductor_passes"):
        CompilationConfig(inductor_passes={"p": 42})  # type: ignore[dict-item]


def test_callable_pass_wrapper_identity_is_the_qualified_name() -> None:
    one, two = CallableInductorPass(graph_pass), CallableInductorPass(graph_pass)
    assert one == two
    assert hash(one) == hash(two)
    assert one.uuid() == hashlib.sha256(one.qualified_name.encode()).hexdigest()
    assert one != CallableInductorPass(os.path.join)
    assert "graph_pass" in repr(one)


# ---------------------------------------------------------------------- torch version rules


def test_auto_functionalized_v2_is_disabled_on_recent_torch() -> None:
    assert CompilationConfig().inductor_compile_config == {"enable_auto_functionalized_v2": False}
    explicit = CompilationConfig(inductor_compile_config={"enable_auto_functionalized_v2": True})
    assert explicit.inductor_compile_config["enable_auto_functionalized_v2"] is True


@pytest.mark.usefixtures("old_torch")
def test_auto_functionalized_v2_is_left_alone_before_torch_2_6() -> None:
    assert CompilationConfig().inductor_compile_config == {}


def test_graph_partition_is_allowed_on_torch_2_9_and_later(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(versions, "torch_version", lambda: (2, 9, 0))
    assert CompilationConfig(use_inductor_graph_partition=True).use_inductor_graph_partition


@pytest.mark.usefixtures("old_torch")
def test_graph_partition_needs_torch_2_9() -> None:
    with pytest.raises(ConfigError, match=r"use_inductor_graph_partition.*torch >= 2\.9.*2\.5\.1"):
        CompilationConfig(use_inductor_graph_partition=True)
    config = CompilationConfig()
    with pytest.raises(ConfigError, match=r"torch >= 2\.9"):
        config.use_inductor_graph_partition = True
    assert config.use_inductor_graph_partition is False


def test_graph_partition_without_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(versions, "torch_version", lambda: None)
    with pytest.raises(ConfigError, match="not installed"):
        CompilationConfig(use_inductor_graph_partition=True)


@pytest.mark.parametrize(
    ("found", "wanted", "ok"),
    [
        ((2, 13, 0), "2.9", True),
        ((2, 9, 0), "2.9", True),
        ((2, 8, 9), "2.9", False),
        (None, "2.6", False),
    ],
)
def test_torch_version_comparison(
    monkeypatch: pytest.MonkeyPatch, found: tuple[int, ...] | None, wanted: str, ok: bool
) -> None:
    monkeypatch.setattr(versions, "torch_version", lambda: found)
    assert versions.torch_version_at_least(wanted) is ok


def test_torch_version_is_read_without_importing_torch() -> None:
    version = versions.torch_version()
    assert version is not None
    assert version >= (2, 6)


# ---------------------------------------------------------------------- hashing


def seed_hash(config: CompilationConfig, passes: Any = None, icc: Any = None) -> str:
    factors = [
        config.level,
        config.backend,
        config.custom_ops,
        config.splitting_ops,
        config.use_inductor,
        config.inductor_compile_config if icc is None else icc,
        config.inductor_passes if passes is None else passes,
        config.pass_config.uuid(),
    ]
    return hashlib.sha256(str(factors).encode()).hexdigest()


def test_compute_hash_is_sha256_of_the_seed_factors() -> None:
    for config in (
        CompilationConfig(),
        CompilationConfig(level=3, backend="inductor", custom_ops=["none", "+rms_norm"]),
        CompilationConfig(
            splitting_ops=["a"], use_inductor=False, inductor_compile_config={"x": 1}
        ),
    ):
        assert config.compute_hash() == seed_hash(config)


def test_callables_are_hashed_by_qualified_name() -> None:
    by_object = CompilationConfig(inductor_passes={"p": graph_pass})
    by_name = CompilationConfig(inductor_passes={"p": f"{__name__}.graph_pass"})
    qualname = f"{__name__}.graph_pass"
    expected = seed_hash(
        by_object,
        passes={"p": qualname},
        icc={"enable_auto_functionalized_v2": False, "p": qualname},
    )
    assert by_object.compute_hash() == expected
    assert by_name.compute_hash() == expected
    other = CompilationConfig(inductor_passes={"p": os.path.join})
    assert other.compute_hash() != expected


@pytest.mark.parametrize(
    "changes",
    [
        {"cudagraph_capture_sizes": [1, 2, 4]},
        {"cudagraph_num_of_warmups": 3},
        {"cudagraph_mode": "FULL"},
        {"cudagraph_copy_inputs": True},
        {"compile_sizes": [1, 2]},
        {"debug_dump_path": Path("/tmp/dump")},
        {"cache_dir": "/tmp/cache"},
        {"pass_config": {"dump_graph_stages": ["x"]}},
    ],
)
def test_runtime_settings_leave_the_hash_alone(changes: dict[str, Any]) -> None:
    assert CompilationConfig(**changes).compute_hash() == CompilationConfig().compute_hash()


@pytest.mark.parametrize(
    "changes",
    [
        {"level": 3},
        {"backend": "eager"},
        {"custom_ops": ["all"]},
        {"splitting_ops": []},
        {"use_inductor": False},
        {"inductor_compile_config": {"max_autotune": True}},
        {"inductor_passes": {"p": "os.path.join"}},
        {"pass_config": {"enable_noop": True}},
    ],
)
def test_graph_settings_change_the_hash(changes: dict[str, Any]) -> None:
    assert CompilationConfig(**changes).compute_hash() != CompilationConfig().compute_hash()


def test_initialising_sizes_does_not_change_the_hash() -> None:
    config = CompilationConfig(level=3)
    before = config.compute_hash()
    config.init_with_cudagraph_sizes([1, 2, 4, 8])
    assert config.compute_hash() == before


def test_stable_factors_sort_sets_and_hide_addresses() -> None:
    opaque = object()
    factors = _common.stable_factors({"s": {"b", "a"}, "o": opaque, "f": graph_pass, "t": (1,)})
    assert factors == {
        "s": ["a", "b"],
        "o": "builtins.object",
        "f": f"{__name__}.graph_pass",
        "t": (1,),
    }


# ---------------------------------------------------------------------- repr


def test_repr_shows_only_what_differs_from_the_defaults() -> None:
    assert repr(CompilationConfig()) == "{}"
    config = CompilationConfig(
        level=3,
        cudagraph_mode="FULL",  # type: ignore[arg-type]
        pass_config={"enable_noop": True},  # type: ignore[arg-type]
        debug_dump_path=Path("/tmp/d"),
    )
    assert repr(config) == (
        "{'level': 3, 'debug_dump_path': '/tmp/d', 'cudagraph_mode': 'FULL', "
        "'pass_config': {'enable_noop': True}}"
    )
    assert str(config) == repr(config)


def test_repr_leaves_out_runtime_bookkeeping() -> None:
    config = CompilationConfig(
        inductor_compile_config={"post_grad_custom_post_pass": graph_pass, "max_autotune": True}
    )
    config.init_with_cudagraph_sizes([1, 2])
    config.enabled_custom_ops["rms_norm"] += 1
    config.traced_files.add("model.py")
    config.compilation_time = 1.5
    config.static_forward_context["layer"] = object()
    text = repr(config)
    for hidden in (
        "post_grad_custom_post_pass",
        "bs_to_padded_graph_size",
        "enabled_custom_ops",
        "traced_files",
        "compilation_time",
        "static_forward_context",
    ):
        assert hidden not in text
    assert "'max_autotune': True" in text
    assert "'cudagraph_capture_sizes': [2, 1]" in text
    assert "'max_capture_size': 2" in text


# ---------------------------------------------------------------------- init_backend


@pytest.mark.parametrize("level", [None, 0])
def test_init_backend_needs_a_compilation_level(level: int | None) -> None:
    with pytest.raises(ConfigError, match="no compilation level"):
        CompilationConfig(level=level).init_backend()


@pytest.fixture
def fake_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compilation, "_registered_backends", lambda: ["eager", "inductor"])


@pytest.mark.usefixtures("fake_registry")
@pytest.mark.parametrize("level", [1, 2])
def test_init_backend_for_dynamo_levels(level: int) -> None:
    assert CompilationConfig(level=level).init_backend() == "eager"
    assert CompilationConfig(level=level, backend="inductor").init_backend() == "inductor"
    assert CompilationConfig(level=level, backend="os.path.join").init_backend() is os.path.join


@pytest.mark.usefixtures("fake_registry")
def test_init_backend_with_an_unknown_backend_names_it() -> None:
    with pytest.raises(ConfigError) as info:
        CompilationConfig(level=2, backend="no_such_backend.fn").init_backend()
    message = str(info.value)
    assert "compilation.backend" in message
    assert "'no_such_backend.fn'" in message
    assert "inductor" in message


@pytest.mark.slow
def test_init_backend_uses_the_real_dynamo_registry() -> None:
    assert CompilationConfig(level=1, backend="aot_eager").init_backend() == "aot_eager"


def test_init_backend_for_piecewise_builds_the_piecewise_backend() -> None:
    import hwplug
    from hwplug.compilation import PiecewiseBackend

    config = CompilationConfig(level=3)
    engine = EngineConfig()
    with hwplug.use_platform("h100") as platform:
        backend = config.init_backend(engine)
    assert isinstance(backend, PiecewiseBackend)
    assert backend.compilation_config is config
    assert backend.engine_config is engine
    assert backend.platform is platform


def test_init_backend_for_piecewise_without_the_backend_is_a_clear_error() -> None:
    class NoBackend:
        """A session whose platform has no piecewise compile backend."""

        def __getattr__(self, name: str) -> Any:
            return getattr(hwplug.default_session(), name)

        def piecewise_backend(self, compilation: Any, engine: Any) -> Any:
            raise RuntimeError("no piecewise compile backend for this platform")

    with pytest.raises(ConfigError, match=r"level=3 \(PIECEWISE\) has no backend here"):
        CompilationConfig(level=3).init_backend(session=NoBackend())  # type: ignore[arg-type]


def test_init_backend_for_piecewise_uses_the_session_it_is_given() -> None:
    session = hwplug.Session(platform="h100")
    backend = CompilationConfig(level=3).init_backend(EngineConfig(), session=session)
    assert backend.platform.name == "cuda"  # type: ignore[union-attr]
    with session.activate():
        active = CompilationConfig(level=3).init_backend(EngineConfig())
    assert active.platform.name == "cuda"  # type: ignore[union-attr]
    default = CompilationConfig(level=3).init_backend()
    assert default.platform is hwplug.get_platform()  # type: ignore[union-attr]


# ---------------------------------------------------------------------- capture sizes


def test_sizes_from_the_argument_are_deduplicated_and_sorted_descending() -> None:
    config = CompilationConfig()
    sizes = [1, 4, 2, 4, 8]
    config.init_with_cudagraph_sizes(sizes)
    assert config.cudagraph_capture_sizes == [8, 4, 2, 1]
    assert sizes == [1, 4, 2, 4, 8]  # the caller's list is not touched
    assert config.max_capture_size == 8
    assert config.bs_to_padded_graph_size == [0, 1, 2, 4, 4, 8, 8, 8, 8]
    assert config.compile_sizes == []


def test_explicit_capture_sizes_override_the_argument() -> None:
    config = CompilationConfig(cudagraph_capture_sizes=[3, 5, 3])
    config.init_with_cudagraph_sizes([1, 2, 4, 8])
    assert config.cudagraph_capture_sizes == [5, 3]
    assert config.max_capture_size == 5
    assert config.bs_to_padded_graph_size == [0, 3, 3, 3, 5, 5]


def test_no_capture_sizes() -> None:
    config = CompilationConfig()
    config.init_with_cudagraph_sizes([])
    assert config.cudagraph_capture_sizes == []
    assert config.max_capture_size == 0
    assert config.bs_to_padded_graph_size == [0]


def test_compile_sizes_expand_the_capture_sizes_token() -> None:
    config = CompilationConfig(compile_sizes=[16, "cudagraph_capture_sizes", 16, 4])
    config.init_with_cudagraph_sizes([1, 4, 2])
    assert config.compile_sizes == [16, 4, 2, 1]
    plain = CompilationConfig(compile_sizes=[8, 8, 1])
    plain.init_with_cudagraph_sizes([1])
    assert plain.compile_sizes == [8, 1]


def test_other_strings_in_compile_sizes_are_an_error_and_change_nothing() -> None:
    config = CompilationConfig(compile_sizes=["capture_sizes"])
    with pytest.raises(ConfigError, match=r"compilation\.compile_sizes.*'cudagraph_capture_sizes'"):
        config.init_with_cudagraph_sizes([1, 2])
    assert config.cudagraph_capture_sizes is None
    assert config.max_capture_size is None
    assert config.compile_sizes == ["capture_sizes"]


@pytest.mark.parametrize("sizes", [[0], [-1], [True]])
def test_capture_sizes_must_be_positive(sizes: list[Any]) -> None:
    with pytest.raises(ValidationError, match="cudagraph_capture_sizes"):
        CompilationConfig(cudagraph_capture_sizes=sizes)
    with pytest.raises(ValidationError, match="cudagraph_capture_sizes"):
        CompilationConfig().init_with_cudagraph_sizes(sizes)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=600), max_size=20))
def test_padding_table_gives_the_smallest_capture_size_at_least_b(sizes: list[int]) -> None:
    config = CompilationConfig()
    config.init_with_cudagraph_sizes(sizes)
    table = config.bs_to_padded_graph_size
    assert table is not None
    assert config.cudagraph_capture_sizes == sorted(set(sizes), reverse=True)
    assert config.max_capture_size == max(sizes, default=0)
    assert len(table) == config.max_capture_size + 1
    assert table[0] == 0
    for b in range(1, len(table)):
        assert table[b] == min(s for s in sizes if s >= b)


# ---------------------------------------------------------------------- splitting ops


def test_set_splitting_ops_needs_level_piecewise() -> None:
    for level in (None, 0, 1, 2):
        with pytest.raises(ConfigError, match=r"compilation\.level.*3 \(PIECEWISE\)"):
            CompilationConfig(level=level).set_splitting_ops_for_v1()


@pytest.mark.parametrize("method", ["set_splitting_ops_for_v1", "set_splitting_ops"])
def test_unset_splitting_ops_become_a_copy_of_the_attention_ops(method: str) -> None:
    config = CompilationConfig(level=3, cudagraph_mode="FULL_AND_PIECEWISE")  # type: ignore[arg-type]
    getattr(config, method)()
    assert config.splitting_ops == ATTENTION_OPS
    assert config.splitting_ops is not CompilationConfig._attention_ops
    assert config.cudagraph_mode is M.FULL_AND_PIECEWISE
    assert config.splitting_ops_contain_attention()


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        (M.PIECEWISE, M.NONE),
        (M.FULL_AND_PIECEWISE, M.FULL),
        (M.FULL, M.FULL),
        (M.FULL_DECODE_ONLY, M.FULL_DECODE_ONLY),
        (None, None),
    ],
)
def test_empty_splitting_ops_drop_piecewise_graphs(
    mode: CUDAGraphMode | None, expected: CUDAGraphMode | None
) -> None:
    config = CompilationConfig(level=3, splitting_ops=[], cudagraph_mode=mode)
    config.set_splitting_ops_for_v1()
    assert config.splitting_ops == []
    assert config.cudagraph_mode is expected


def test_explicit_splitting_ops_are_kept() -> None:
    config = CompilationConfig(level=3, splitting_ops=["my.op"], cudagraph_mode="PIECEWISE")  # type: ignore[arg-type]
    config.set_splitting_ops_for_v1()
    assert config.splitting_ops == ["my.op"]
    assert config.cudagraph_mode is M.PIECEWISE


@pytest.mark.parametrize("splitting_ops", [None, [], ["my.op"]])
def test_graph_partition_empties_the_splitting_ops(splitting_ops: list[str] | None) -> None:
    config = CompilationConfig(
        level=3, use_inductor_graph_partition=True, splitting_ops=splitting_ops
    )
    config.set_splitting_ops_for_v1()
    assert config.splitting_ops == []


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        (M.PIECEWISE, M.FULL),
        (M.FULL_AND_PIECEWISE, M.FULL),
        (M.FULL_DECODE_ONLY, M.FULL_DECODE_ONLY),
        (M.NONE, M.NONE),
        (None, None),
    ],
)
def test_attention_fusion_keeps_attention_compiled(
    mode: CUDAGraphMode | None, expected: CUDAGraphMode | None
) -> None:
    config = CompilationConfig(
        level=3,
        cudagraph_mode=mode,
        pass_config={"enable_attn_fusion": True, "enable_noop": True},  # type: ignore[arg-type]
    )
    config.set_splitting_ops_for_v1()
    assert config.splitting_ops == []
    assert config.cudagraph_mode is expected


def test_attention_fusion_with_attention_splitting_ops_is_an_error() -> None:
    config = CompilationConfig(
        level=3,
        splitting_ops=list(ATTENTION_OPS),
        pass_config={"enable_attn_fusion": True, "enable_noop": True},  # type: ignore[arg-type]
    )
    with pytest.raises(
        ConfigError, match=r"compilation\.splitting_ops.*attention.*enable_attn_fusion"
    ):
        config.set_splitting_ops_for_v1()


def test_helpers_refuse_when_their_feature_is_off() -> None:
    with pytest.raises(ConfigError, match="use_inductor_graph_partition is False"):
        CompilationConfig(level=3).set_splitting_ops_for_inductor_graph_partition()
    with pytest.raises(ConfigError, match="enable_attn_fusion is False"):
        CompilationConfig(level=3).set_splitting_ops_for_attn_fusion()


def test_splitting_ops_contain_attention_needs_every_attention_op() -> None:
    assert not CompilationConfig().splitting_ops_contain_attention()
    assert not CompilationConfig(splitting_ops=ATTENTION_OPS[:3]).splitting_ops_contain_attention()
    assert CompilationConfig(splitting_ops=[*ATTENTION_OPS, "x"]).splitting_ops_contain_attention()


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({}, False),
        ({"level": 0}, False),
        ({"level": 3, "splitting_ops": ATTENTION_OPS}, True),
        ({"level": 3, "splitting_ops": []}, False),
        ({"level": 3, "splitting_ops": [], "use_inductor_graph_partition": True}, True),
        (
            {
                "level": 3,
                "splitting_ops": [],
                "use_inductor_graph_partition": True,
                "use_inductor": False,
            },
            False,
        ),
        ({"level": 2, "backend": "inductor", "use_inductor_graph_partition": True}, True),
        ({"level": 2, "backend": "eager", "use_inductor_graph_partition": True}, False),
    ],
)
def test_is_attention_compiled_piecewise(kwargs: dict[str, Any], expected: bool) -> None:
    assert CompilationConfig(**kwargs).is_attention_compiled_piecewise() is expected


# ---------------------------------------------------------------------- custom op log check


def test_custom_op_log_check_warns_about_ops_absent_from_the_model(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = CompilationConfig(custom_ops=["none", "+rms_norm", "+ghost", "-phantom"])
    config.enabled_custom_ops.update(["rms_norm"])
    config.disabled_custom_ops.update(["silu_and_mul"])
    with caplog.at_level(logging.DEBUG, logger="hwplug.config"):
        config.custom_op_log_check()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert "'ghost'" in warnings[0]
    assert "enabling" in warnings[0]
    assert "'phantom'" in warnings[1]
    assert "disabling" in warnings[1]
    assert any("rms_norm" in r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG)


def test_custom_op_log_check_without_custom_ops_in_the_model(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.DEBUG, logger="hwplug.config"):
        CompilationConfig(custom_ops=["+ghost"]).custom_op_log_check()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("no custom ops" in r.getMessage() for r in caplog.records)
