"""Bounded input: sizes, memory figures, nesting and long numbers in configs.

platforms.md ("Checks every platform shares"): capture sizes, ``max_num_seqs``
and ``max_num_batched_tokens`` above 2**20, and memory figures above 2**60
bytes, are a ``ConfigError`` before any table is built. Configs nest a few
levels at most; numbers too long to convert, unicode digits and deep nesting
in dicts, files and ``--set`` values are user errors naming where they are
(exit status 2 and one line on the command line), never a bare ``ValueError``,
``RecursionError`` or ``MemoryError``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hwplug
from hwplug import ConfigError
from hwplug.core.config import EngineConfig
from tests.cli import conftest as cli_conftest
from tests.cli.conftest import Result, assert_user_error, run_hwplug

MAX_SIZE = 1 << 20
MAX_BYTES = 1 << 60
SECTIONS = EngineConfig.section_types()
FIELDS = {name: cls.init_field_names() for name, cls in SECTIONS.items()}
LEVELS = ("0 (NO_COMPILATION)", "1 (DYNAMO_AS_IS)", "2 (DYNAMO_ONCE)", "3 (PIECEWISE)")
# Superscript two (isdigit, not decimal), fullwidth three and Arabic-Indic one
# (both decimal to Python's int(), but not ASCII).
UNICODE_DIGITS = ("²", "\uff13", "\u0661")
DEEP = 100_000

cli = cli_conftest.cli  # the in-process ``hwplug`` fixture


def refused(data: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as info:
        EngineConfig.from_dict(data)
    return str(info.value)


def nested_dicts(depth: int, leaf: Any = 1) -> Any:
    value = leaf
    for _ in range(depth):
        value = {"a": value}
    return value


def nested_lists(depth: int, leaf: Any = 1) -> Any:
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


# ---------------------------------------------------------------------------
# Sizes and memory figures
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("size", [50_000_000, 1_000_000_000, MAX_SIZE + 1])
@pytest.mark.parametrize(
    "path", ["compilation.cudagraph_capture_sizes", "scheduler.cuda_graph_sizes"]
)
def test_capture_sizes_above_2_20_are_refused_before_any_table(path: str, size: int) -> None:
    section, field = path.split(".")
    message = refused({section: {field: [size]}})
    assert f"{path}[0]" in message
    assert str(MAX_SIZE) in message
    assert str(size) in message


@pytest.mark.parametrize(
    "path", ["compilation.cudagraph_capture_sizes", "scheduler.cuda_graph_sizes"]
)
def test_capture_sizes_at_the_bound_are_accepted(path: str) -> None:
    section, field = path.split(".")
    config = EngineConfig.from_dict({section: {field: [1, MAX_SIZE]}})
    assert getattr(getattr(config, section), field) == [1, MAX_SIZE]


@pytest.mark.parametrize("field", ["max_num_seqs", "max_num_batched_tokens"])
@pytest.mark.parametrize("value", [MAX_SIZE + 1, 50_000_000, 2**61, 10**30])
def test_scheduler_limits_above_2_20_are_refused(field: str, value: int) -> None:
    message = refused({"scheduler": {field: value}})
    assert f"scheduler.{field}" in message
    assert str(MAX_SIZE) in message


@pytest.mark.parametrize("field", ["max_num_seqs", "max_num_batched_tokens"])
def test_scheduler_limits_at_2_20_are_accepted(field: str) -> None:
    config = EngineConfig.from_dict({"scheduler": {field: MAX_SIZE}})
    assert getattr(config.scheduler, field) == MAX_SIZE


@pytest.mark.parametrize("field", ["kv_cache_memory_bytes", "cpu_kvcache_space_bytes"])
@pytest.mark.parametrize("value", [MAX_BYTES + 1, 2**64, 10**30])
def test_memory_figures_above_2_60_are_refused(field: str, value: int) -> None:
    message = refused({"cache": {field: value}})
    assert f"cache.{field}" in message
    assert str(MAX_BYTES) in message


@pytest.mark.parametrize("field", ["kv_cache_memory_bytes", "cpu_kvcache_space_bytes"])
def test_memory_figures_at_2_60_are_accepted(field: str) -> None:
    config = EngineConfig.from_dict({"cache": {field: MAX_BYTES}})
    assert getattr(config.cache, field) == MAX_BYTES


def test_a_huge_capture_size_on_the_command_line_is_one_error_line(cli: Any) -> None:
    result = cli(
        "resolve", "--simulate", "h100", "--set", "compilation.cudagraph_capture_sizes=[50000000]"
    )
    assert_user_error(result, "compilation.cudagraph_capture_sizes", str(MAX_SIZE))


# ---------------------------------------------------------------------------
# Nesting
# ---------------------------------------------------------------------------


def deep_file(tmp_path: Path, suffix: str, depth: int, *, lists: bool) -> Path:
    """A config whose ``compilation.inductor_compile_config.a`` nests ``depth`` levels."""
    if suffix == ".json":
        inner = "[" * depth + "]" * depth if lists else '{"a":' * depth + "1" + "}" * depth
        text = '{"compilation": {"inductor_compile_config": {"a": ' + inner + "}}}"
    elif suffix == ".yaml":
        inner = "[" * depth + "]" * depth if lists else "{a: " * depth + "1" + "}" * depth
        text = "compilation:\n  inductor_compile_config:\n    a: " + inner + "\n"
    else:
        inner = "[" * depth + "]" * depth if lists else "{a = " * depth + "1" + "}" * depth
        text = "[compilation]\ninductor_compile_config = {a = " + inner + "}\n"
    path = tmp_path / f"deep{suffix}"
    path.write_text(text)
    return path


@pytest.mark.parametrize("suffix", [".json", ".yaml", ".toml"])
def test_a_file_nested_100000_levels_is_a_config_error_naming_the_file(
    tmp_path: Path, suffix: str
) -> None:
    path = deep_file(tmp_path, suffix, DEEP, lists=True)
    with pytest.raises(ConfigError) as info:
        EngineConfig.from_file(path)
    message = str(info.value)
    assert str(path) in message
    assert "nested" in message
    with pytest.raises(ConfigError):
        EngineConfig.file_data(path)


@pytest.mark.parametrize("suffix", [".json", ".yaml", ".toml"])
def test_a_file_nested_40_dicts_deep_is_a_config_error_naming_file_and_path(
    tmp_path: Path, suffix: str
) -> None:
    path = deep_file(tmp_path, suffix, 40, lists=False)
    with pytest.raises(ConfigError) as info:
        EngineConfig.from_file(path)
    message = str(info.value)
    assert str(path) in message
    assert "compilation.inductor_compile_config.a.a" in message
    assert "nested more than 32 levels" in message


@pytest.mark.parametrize(
    ("data", "where"),
    [
        (
            {"compilation": {"inductor_compile_config": nested_dicts(40)}},
            "compilation.inductor_compile_config.a.a",
        ),
        (
            {"compilation": {"inductor_compile_config": {"x": nested_lists(40)}}},
            "compilation.inductor_compile_config.x[0][0]",
        ),
        ({"scheduler": {"cuda_graph_sizes": nested_lists(40)}}, "scheduler.cuda_graph_sizes[0]"),
        ({"model": nested_dicts(40)}, "model.a.a"),
        ({"compilation": {"inductor_passes": nested_dicts(40)}}, "compilation.inductor_passes.a"),
    ],
)
def test_from_dict_nested_40_deep_is_a_config_error_naming_the_path(
    data: dict[str, Any], where: str
) -> None:
    message = refused(data)
    assert where in message
    assert "nested more than 32 levels" in message


def test_from_dict_nested_100000_deep_is_a_config_error() -> None:
    message = refused({"compilation": {"inductor_compile_config": {"a": nested_lists(DEEP)}}})
    assert "compilation.inductor_compile_config.a[0]" in message


def test_nesting_within_the_bound_is_accepted() -> None:
    config = EngineConfig.from_dict({"compilation": {"inductor_compile_config": nested_dicts(20)}})
    assert config.compilation.inductor_compile_config["a"]["a"]["a"] is not None


@pytest.mark.parametrize("depth", [40, DEEP])
def test_a_deeply_nested_set_value_is_one_error_line(cli: Any, depth: int) -> None:
    value = '{"a":' + "[" * depth + "]" * depth + "}"
    result = cli(
        "resolve", "--simulate", "h100", "--set", f"compilation.inductor_compile_config={value}"
    )
    assert_user_error(result, "compilation.inductor_compile_config", "nested")


def test_a_deeply_nested_config_file_on_the_command_line_is_one_error_line(
    cli: Any, tmp_path: Path
) -> None:
    path = deep_file(tmp_path, ".json", DEEP, lists=True)
    assert_user_error(cli("resolve", "--simulate", "h100", "--config", str(path)), str(path))


# ---------------------------------------------------------------------------
# Numbers too long to convert
# ---------------------------------------------------------------------------

LONG = "9" * 5000


@pytest.mark.parametrize(
    ("suffix", "text"),
    [
        (".json", '{"scheduler": {"max_num_seqs": ' + LONG + "}}"),
        (".json", '{"scheduler": {"max_num_seqs": -' + LONG + "}}"),
        (".yaml", f"scheduler:\n  max_num_seqs: {LONG}\n"),
        (".yaml", f"scheduler:\n  max_num_seqs: -{LONG}\n"),
    ],
)
def test_a_5000_digit_number_in_a_file_names_the_field(
    tmp_path: Path, suffix: str, text: str
) -> None:
    path = tmp_path / f"long{suffix}"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        EngineConfig.from_file(path)
    message = str(info.value)
    assert str(path) in message
    assert "scheduler.max_num_seqs" in message
    assert LONG[:200] not in message


def test_a_5000_digit_number_in_toml_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "long.toml"
    path.write_text(f"[scheduler]\nmax_num_seqs = {LONG}\n")
    with pytest.raises(ConfigError) as info:
        EngineConfig.from_file(path)
    message = str(info.value)
    assert str(path) in message
    assert "line 2" in message
    assert LONG[:200] not in message


@pytest.mark.parametrize(
    "value", [10**4999, -(10**4999), 2**20000], ids=["5000-digits", "minus-5000-digits", "2**20000"]
)
@pytest.mark.parametrize(
    "path",
    [
        "scheduler.max_num_seqs",
        "model.max_model_len",
        "cache.kv_cache_memory_bytes",
        "compilation.cudagraph_num_of_warmups",
    ],
)
def test_a_5000_digit_number_in_a_dict_names_the_field(path: str, value: int) -> None:
    section, field = path.split(".")
    message = refused({section: {field: value}})
    assert path in message
    assert "digits" in message


@pytest.mark.parametrize(
    "path", ["compilation.compile_sizes", "compilation.cudagraph_capture_sizes"]
)
def test_a_5000_digit_size_in_a_list_names_the_entry(path: str) -> None:
    section, field = path.split(".")
    message = refused({section: {field: [8, 10**4999]}})
    assert f"{path}[1]" in message


def test_a_5000_digit_set_value_is_one_error_line(cli: Any) -> None:
    result = cli("resolve", "--simulate", "h100", "--set", f"scheduler.max_num_seqs={LONG}")
    # Described by its length, not echoed (nor misread as a string).
    line = assert_user_error(result, "scheduler.max_num_seqs", "5000 digits")
    assert LONG[:200] not in line


@pytest.mark.parametrize("suffix", [".json", ".yaml", ".toml"])
def test_a_5000_digit_number_in_a_config_file_on_the_command_line(
    cli: Any, tmp_path: Path, suffix: str
) -> None:
    texts = {
        ".json": '{"scheduler": {"max_num_seqs": ' + LONG + "}}",
        ".yaml": f"scheduler:\n  max_num_seqs: {LONG}\n",
        ".toml": f"[scheduler]\nmax_num_seqs = {LONG}\n",
    }
    path = tmp_path / f"long{suffix}"
    path.write_text(texts[suffix])
    result = cli("resolve", "--simulate", "h100", "--config", str(path))
    line = assert_user_error(result, str(path))
    assert ("line 2" if suffix == ".toml" else "scheduler.max_num_seqs") in line


def test_a_5000_digit_set_value_in_a_fresh_process() -> None:
    result = run_hwplug("resolve", "--simulate", "h100", "--set", f"scheduler.max_num_seqs={LONG}")
    assert_user_error(result, "scheduler.max_num_seqs", "5000 digits")


# ---------------------------------------------------------------------------
# Unicode digits and the compilation section's own checks
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("level", [*UNICODE_DIGITS, " ²", "2²", "4", "-1", 4, 2.0, True])
def test_a_level_that_is_not_0_to_3_lists_the_allowed_levels(level: Any) -> None:
    message = refused({"compilation": {"level": level}})
    assert "compilation.level" in message
    for allowed in LEVELS:
        assert allowed in message


@pytest.mark.parametrize("level", ["0", "3", " 2 ", "piecewise", "DYNAMO_ONCE", 1])
def test_allowed_level_spellings(level: Any) -> None:
    config = EngineConfig.from_dict({"compilation": {"level": level}})
    assert config.compilation.level in (0, 1, 2, 3)


@pytest.mark.parametrize("level", UNICODE_DIGITS)
def test_a_unicode_digit_level_on_the_command_line_is_one_error_line(cli: Any, level: str) -> None:
    result = cli("resolve", "--simulate", "h100", "--set", f"compilation.level={level}")
    assert_user_error(result, "compilation.level", *LEVELS)


@pytest.mark.parametrize(
    ("sizes", "where"),
    [
        ([0], "compilation.compile_sizes[0]"),
        ([-1], "compilation.compile_sizes[0]"),
        ([8, MAX_SIZE + 1], "compilation.compile_sizes[1]"),
        (["cudagraph_capture_sizes", 0], "compilation.compile_sizes[1]"),
        ([True], "compilation.compile_sizes[0]"),
        ([1.5], "compilation.compile_sizes[0]"),
        ([None], "compilation.compile_sizes[0]"),
        ([[4]], "compilation.compile_sizes[0]"),
    ],
)
def test_a_bad_compile_size_names_its_entry_without_internals(sizes: list[Any], where: str) -> None:
    message = refused({"compilation": {"compile_sizes": sizes}})
    assert where in message
    assert str(MAX_SIZE) in message
    assert "0x" not in message
    assert "function-after" not in message
    assert "<function" not in message


def test_compile_sizes_within_the_bound_are_accepted() -> None:
    config = EngineConfig.from_dict(
        {"compilation": {"compile_sizes": [1, MAX_SIZE, "cudagraph_capture_sizes"]}}
    )
    assert config.compilation.compile_sizes == [1, MAX_SIZE, "cudagraph_capture_sizes"]


@pytest.mark.parametrize("field", ["max_num_seqs", "max_num_batched_tokens"])
@pytest.mark.parametrize("digit", UNICODE_DIGITS)
def test_unicode_digit_strings_in_integer_fields_are_config_errors(field: str, digit: str) -> None:
    message = refused({"scheduler": {field: digit}})
    assert f"scheduler.{field}" in message


# ---------------------------------------------------------------------------
# Device counts in profiles
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec",
    ["h100:99999999999", "h100:²", "h100:\uff11", "h100:0", f"h100:{MAX_SIZE + 1}", "h100:" + LONG],
    ids=["11-digits", "superscript", "fullwidth", "zero", "2**20+1", "5000-digits"],
)
def test_a_bad_device_count_to_simulate_is_one_error_line(cli: Any, spec: str) -> None:
    assert_user_error(cli("resolve", "--simulate", spec), "device count")


@pytest.mark.parametrize("spec", ["h100:99999999999", "h100:²", "h100:-1"])
def test_a_bad_device_count_is_a_config_error_in_the_api(spec: str) -> None:
    with pytest.raises(ConfigError, match="device count"), hwplug.use_platform(spec):
        pass
    with pytest.raises(ConfigError, match="device count"):
        hwplug.resolve(platform=spec)


def test_a_good_device_count_is_accepted() -> None:
    with hwplug.use_platform("h100:8") as platform:
        assert len(platform.devices) == 8


# ---------------------------------------------------------------------------
# Fuzzing: dicts, files and --set values of many shapes
# ---------------------------------------------------------------------------

huge_ints = st.sampled_from([10**4000, -(10**4000), 2**61, 2**60 + 1, 2**20 + 1, 10**30, -(2**63)])
odd_floats = st.sampled_from([math.nan, math.inf, -math.inf, 1e308, -0.0, 5e-324, 2.0**70])
digit_strings = st.text(
    alphabet=st.sampled_from(
        [*UNICODE_DIGITS, "0", "1", "9", "\u0660", "\U0001d7d7", "\u216b", "½", "⁵", " ", "-"]
    ),
    min_size=1,
    max_size=6,
)


@dataclasses.dataclass(frozen=True)
class Long:
    """Stands for an integer of ``digits`` digits (too long for Python to print)."""

    digits: int
    negative: bool = False

    def text(self) -> str:
        return ("-" if self.negative else "") + "9" * self.digits

    def value(self) -> int:
        return (-1 if self.negative else 1) * 10 ** (self.digits - 1)


@dataclasses.dataclass(frozen=True)
class Deep:
    """Stands for nested empty lists, deeper than any parser recurses."""

    yaml_depth: ClassVar[int] = 600  # PyYAML recurses ~3 frames a level and is slow on more
    depth: ClassVar[int] = DEEP

    def text(self, *, for_yaml: bool = False) -> str:
        depth = self.yaml_depth if for_yaml else self.depth
        return "[" * depth + "]" * depth

    def value(self) -> Any:
        return nested_lists(self.depth - 1, [])


markers = st.builds(Long, st.sampled_from([4400, 5000]), st.booleans()) | st.just(Deep())
leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 2**21),
    huge_ints,
    odd_floats,
    st.floats(allow_nan=True, allow_infinity=True),
    digit_strings,
    st.sampled_from(["auto", "FULL", "piecewise", "none", "+op", "cudagraph_capture_sizes", ""]),
    markers,
    markers,
)


@st.composite
def deep_values(draw: st.DrawFn) -> Any:
    """A leaf wrapped in up to 45 lists or dicts (past the bound of 32 now and then)."""
    value = draw(leaves)
    for kind in draw(st.lists(st.sampled_from(["list", "dict"]), max_size=45)):
        value = [value] if kind == "list" else {"k": value}
    return value


values = st.one_of(
    leaves,
    leaves,
    deep_values(),
    st.lists(leaves, max_size=4),
    st.dictionaries(st.sampled_from(["dce", "a", "b"]), leaves, max_size=3),
)


@st.composite
def engine_dicts(draw: st.DrawFn) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for section in draw(st.lists(st.sampled_from(list(SECTIONS)), max_size=3, unique=True)):
        keys = st.sampled_from(FIELDS[section])
        data[section] = draw(st.dictionaries(keys, values, max_size=3))
    return data


def as_python(value: Any) -> Any:
    """The fuzzed value with its markers made real (long integers, deep lists)."""
    if isinstance(value, Long | Deep):
        return value.value()
    if isinstance(value, dict):
        return {key: as_python(item) for key, item in value.items()}
    if isinstance(value, list):
        return [as_python(item) for item in value]
    return value


def with_placeholders(value: Any, texts: dict[str, str], *, for_yaml: bool = False) -> Any:
    """``value`` with each marker replaced by a placeholder string, its text in ``texts``."""
    if isinstance(value, Long | Deep):
        name = f"HWPLUG_PLACEHOLDER_{len(texts)}"
        texts[name] = (
            value.text(for_yaml=True) if isinstance(value, Deep) and for_yaml else value.text()
        )
        return name
    if isinstance(value, dict):
        return {
            key: with_placeholders(item, texts, for_yaml=for_yaml) for key, item in value.items()
        }
    if isinstance(value, list):
        return [with_placeholders(item, texts, for_yaml=for_yaml) for item in value]
    return value


def fill_placeholders(text: str, texts: dict[str, str]) -> str:
    return re.sub(r"""["']?(HWPLUG_PLACEHOLDER_\d+)["']?""", lambda m: texts[m.group(1)], text)


def as_json(value: Any) -> str:
    texts: dict[str, str] = {}
    return fill_placeholders(json.dumps(with_placeholders(value, texts)), texts)


def as_yaml(value: Any) -> str:
    texts: dict[str, str] = {}
    data = with_placeholders(value, texts, for_yaml=True)
    dumped = yaml.safe_dump(data, allow_unicode=True, width=10**9)
    return fill_placeholders(dumped, texts)


FUZZ = settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)


def only_config_errors(build: Any) -> None:
    """``build()`` succeeds or raises ``ConfigError`` (anything else fails the test)."""
    try:
        build()
    except ConfigError as exc:
        message = str(exc)
    else:
        return
    assert message


@FUZZ
@given(engine_dicts())
def test_fuzzed_dicts_give_a_config_or_a_config_error(data: dict[str, Any]) -> None:
    only_config_errors(lambda: EngineConfig.from_dict(as_python(data)))


@FUZZ
@given(engine_dicts())
def test_fuzzed_json_files_give_a_config_or_a_config_error(
    tmp_path_factory: pytest.TempPathFactory, data: dict[str, Any]
) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "config.json"
    path.write_text(as_json(data))
    only_config_errors(lambda: EngineConfig.from_file(path))


@settings(FUZZ, max_examples=60)  # PyYAML is slow on deeply nested text
@given(engine_dicts())
def test_fuzzed_yaml_files_give_a_config_or_a_config_error(
    tmp_path_factory: pytest.TempPathFactory, data: dict[str, Any]
) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "config.yaml"
    path.write_text(as_yaml(data))
    only_config_errors(lambda: EngineConfig.from_file(path))


def assert_ok_or_one_error_line(result: Result) -> None:
    assert result.returncode in (0, 2), (result.returncode, result.stderr)
    if result.returncode == 2:
        assert_user_error(result)
    else:
        assert "hwplug: error" not in result.stderr


@FUZZ
@given(
    st.sampled_from([(s, f) for s in SECTIONS for f in FIELDS[s]]),
    values,
    st.booleans(),
    st.sampled_from(["h100", "cpu-generic"]),
)
def test_fuzzed_set_values_exit_0_or_2_with_one_line(
    cli: Any, target: tuple[str, str], value: Any, raw: bool, profile: str
) -> None:
    section, field = target
    text = value if raw and isinstance(value, str) else as_json(value)
    result = cli("resolve", "--simulate", profile, "--set", f"{section}.{field}={text}")
    assert_ok_or_one_error_line(result)


# ---------------------------------------------------------------------------
# YAML aliases: a few hundred bytes that stand for billions of values
# ---------------------------------------------------------------------------


def alias_bomb(levels: int = 9) -> str:
    """A YAML document under 1 KiB whose aliases expand to 9**levels lists of strings."""
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels):
        refs = ", ".join([f"*a{i - 1}"] * 9)
        lines.append(f"a{i}: &a{i} [{refs}]")
    body = "\n".join("    " + line for line in lines)
    return f"compilation:\n  inductor_compile_config:\n{body}\n"


def test_the_alias_bomb_is_small() -> None:
    assert len(alias_bomb().encode()) < 1024


FROM_FILE = """
import sys
from hwplug import ConfigError
from hwplug.core.config import EngineConfig
try:
    EngineConfig.from_file(sys.argv[1])
except ConfigError as exc:
    print(exc)
"""


def test_a_yaml_alias_bomb_is_refused_at_once_by_from_file(tmp_path: Path) -> None:
    import subprocess
    import sys

    path = tmp_path / "bomb.yaml"
    path.write_text(alias_bomb())
    # a hang is a failure: the walk of every shared path never ends
    result = subprocess.run(
        [sys.executable, "-c", FROM_FILE, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert str(path) in result.stdout
    assert "values" in result.stdout


def test_a_yaml_alias_bomb_on_the_command_line_is_one_error_line(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(alias_bomb())
    result = run_hwplug("resolve", "--simulate", "h100", "--config", str(path))
    assert_user_error(result, str(path), "values")


def test_aliases_that_stay_small_are_accepted(tmp_path: Path) -> None:
    path = tmp_path / "aliases.yaml"
    path.write_text(
        "scheduler: &s\n  max_num_seqs: 4\ncompilation:\n  inductor_compile_config:\n"
        "    a: &x [1, 2]\n    b: *x\n"
    )
    config = EngineConfig.from_file(path)
    inductor = config.compilation.inductor_compile_config
    assert (inductor["a"], inductor["b"], config.scheduler.max_num_seqs) == ([1, 2], [1, 2], 4)
