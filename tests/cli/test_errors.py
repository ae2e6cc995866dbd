"""Every user error: exit status 2, one ``hwplug: error:`` line, no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hwplug.cli import CliError, parse_set_option
from hwplug.core.errors import PluginError
from tests.cli.conftest import assert_user_error, run_hwplug

# One case per kind of user error, each through a real process:
# (arguments, environment, fragments the message must contain).
PROCESS_CASES = [
    pytest.param(["bogus"], {}, ["No such command 'bogus'"], id="unknown-command"),
    pytest.param(["info", "--bogus"], {}, ["No such option: --bogus", "hwplug info"], id="option"),
    pytest.param(
        ["resolve", "--simulate", "h1000"],
        {},
        ["unknown device profile 'h1000'", "known profiles:", "h100", "mi300x"],
        id="unknown-profile",
    ),
    pytest.param(
        ["resolve", "--platform", "tpu"],
        {"HWPLUG_PLUGINS": ""},
        ["unknown platform 'tpu'", "known platforms: cpu, cuda, hpu, rocm, xpu"],
        id="unknown-platform",
    ),
    pytest.param(
        ["resolve", "--platform", "cdua"],
        {"HWPLUG_PLUGINS": ""},
        ["unknown platform 'cdua' (did you mean 'cuda'?)", "known platforms: cpu, cuda"],
        id="unknown-platform-near-miss",
    ),
    pytest.param(
        ["resolve", "--platform", "cuda", "--simulate", "h100"],
        {},
        ["--platform and --simulate are mutually exclusive"],
        id="platform-and-simulate",
    ),
    pytest.param(
        ["resolve", "--set", "cache.blok_size=32"],
        {},
        ["cache has no field 'blok_size'", "did you mean 'block_size'", "block_size, "],
        id="unknown-field",
    ),
    pytest.param(
        ["resolve", "--set", "kache.block_size=32"],
        {},
        ["unknown section 'kache'", "model, cache, compilation, parallel, scheduler"],
        id="unknown-section",
    ),
    pytest.param(
        ["resolve", "--set", "cache.block_size"],
        {},
        ["expected section.field=value"],
        id="bad-set-syntax",
    ),
    pytest.param(
        ["resolve", "--simulate", "h100", "--set", "cache.block_size=7"],
        {},
        ["cache.block_size=7", "NVIDIA H100", "8, 16, 32"],
        id="config-error-from-resolution",
    ),
    pytest.param(
        ["resolve", "--set", "cache.block_size=abc"],
        {},
        ["cache.block_size", "valid integer", "'abc'"],
        id="validation-error",
    ),
    pytest.param(
        ["resolve", "--config", "/nonexistent/engine.yaml"],
        {},
        ["/nonexistent/engine.yaml", "cannot read"],
        id="unreadable-file",
    ),
    pytest.param(
        ["info"],
        {"HWPLUG_PLATFORM": "hpu"},
        ["HWPLUG_PLATFORM=hpu", "no hpu device was detected", "gaudi2"],
        id="forced-absent-platform",
    ),
    pytest.param(
        ["matrix", "--format", "xml"],
        {},
        ["--format", "'xml'", "table, markdown, json"],
        id="bad-format",
    ),
]


@pytest.mark.parametrize(("args", "env", "fragments"), PROCESS_CASES)
def test_user_errors_exit_2_with_one_line(args: list[str], env: dict[str, str], fragments) -> None:
    result = run_hwplug(*args, env=env)
    assert_user_error(result, *fragments)
    assert result.stdout == ""


def test_malformed_config_file_through_a_process(tmp_path: Path) -> None:
    path = tmp_path / "engine.yaml"
    path.write_text("cache:\n  block_size: [1,\n")
    result = run_hwplug("resolve", "--config", str(path))
    assert_user_error(result, str(path), "malformed YAML", "line 3")


# More of the same kinds, in-process (the same code path, without process start-up).
IN_PROCESS_CASES = [
    pytest.param(
        ["resolve", "--simulate"], {}, ["--simulate", "requires an argument"], id="missing-value"
    ),
    pytest.param(
        ["resolve", "--simulate", "h100:zero"],
        {},
        ["device count", "positive integer"],
        id="bad-profile-count",
    ),
    pytest.param(
        ["resolve", "--platform", "h100"],
        {},
        ["'h100' is a device profile: use --simulate h100"],
        id="profile-given-as-platform",
    ),
    pytest.param(
        ["resolve", "--set", "block_size=32"],
        {},
        ["not a section.field path"],
        id="set-without-section",
    ),
    pytest.param(
        ["resolve", "--set", "=32"], {}, ["expected section.field=value"], id="set-empty-key"
    ),
    pytest.param(
        ["resolve", "--set", "cache.block_size.x=1"],
        {},
        ["cache.block_size is a plain value", "use --set cache.block_size=VALUE"],
        id="set-below-a-plain-field",
    ),
    pytest.param(
        ["resolve", "--simulate", "gaudi2", "--set", "cache.cache_dtype=fp8"],
        {},
        ["cache.cache_dtype", "fp8_inc"],
        id="platform-rule",
    ),
    pytest.param(
        ["resolve", "--set", "compilation.cudagraph_mode=SOMETIMES"],
        {},
        ["compilation.cudagraph_mode", "SOMETIMES", "FULL_AND_PIECEWISE"],
        id="bad-enum",
    ),
    pytest.param(
        ["info"],
        {"HWPLUG_SIMULATE": "nosuchdevice"},
        ["unknown device profile 'nosuchdevice'"],
        id="bad-HWPLUG_SIMULATE",
    ),
    pytest.param(
        ["resolve"],
        {"HWPLUG_SIMULATE": "h100", "HWPLUG_PLATFORM": "rocm"},
        ["HWPLUG_SIMULATE=h100 is a cuda profile but HWPLUG_PLATFORM=rocm"],
        id="contradicting-environment",
    ),
]


@pytest.mark.parametrize(("args", "env", "fragments"), IN_PROCESS_CASES)
def test_more_user_errors_in_process(cli, monkeypatch, args, env, fragments) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    result = cli(*args)
    assert_user_error(result, *fragments)
    assert result.stdout == ""


@pytest.mark.parametrize(
    ("suffix", "text", "fragments"),
    [
        (".yaml", "cache:\n  block_size: [1,\n", ["malformed YAML", "line 3"]),
        (".json", '{"cache": {"block_size": }', ["malformed JSON", "line 1"]),
        (".toml", "[cache\nblock_size = 1\n", ["malformed TOML"]),
        (".yaml", "cache:\n  blok_size: 16\n", ["cache.blok_size", "did you mean 'block_size'"]),
        (".yaml", "- 1\n- 2\n", ["mapping of sections"]),
        (".ini", "[cache]\n", ["unsupported config file type", ".toml"]),
    ],
)
def test_bad_config_files_name_the_file_and_the_place(
    cli, tmp_path: Path, suffix: str, text: str, fragments: list[str]
) -> None:
    path = tmp_path / f"engine{suffix}"
    path.write_text(text)
    line = assert_user_error(cli("resolve", "--config", str(path)), *fragments)
    assert str(path) in line


def test_set_on_top_of_a_bad_file_reports_the_file(cli, tmp_path: Path) -> None:
    path = tmp_path / "engine.json"
    path.write_text("[]")
    result = cli("resolve", "--config", str(path), "--set", "cache.block_size=16")
    assert_user_error(result, str(path))


def test_a_warning_before_an_error_is_not_printed(cli) -> None:
    # use_cudagraph=False logs a deprecation warning, then conflicts with FULL.
    result = cli(
        "resolve",
        "--set",
        "compilation.use_cudagraph=false",
        "--set",
        "compilation.cudagraph_mode=FULL",
    )
    assert_user_error(result, "mutually exclusive")


def test_plugin_errors_from_selection_are_user_errors(cli, monkeypatch) -> None:
    def broken() -> None:
        raise PluginError("plugin 'acme' from distribution 'acme-npu' failed in load: boom")

    monkeypatch.setattr("hwplug.cli.select_platform", broken)
    result = cli("info")
    assert_user_error(result, "plugin 'acme'", "acme-npu")


def test_a_bug_is_not_disguised_as_a_user_error(cli, monkeypatch) -> None:
    def buggy() -> None:
        raise KeyError("internal")

    monkeypatch.setattr("hwplug.cli.select_platform", buggy)
    with pytest.raises(KeyError):
        cli("info")


# --------------------------------------------------------------------------- --set parsing


@pytest.mark.parametrize(
    ("text", "path", "value"),
    [
        ("cache.block_size=32", ["cache", "block_size"], 32),
        ("compilation.cudagraph_mode=FULL", ["compilation", "cudagraph_mode"], "FULL"),
        ("compilation.splitting_ops=[]", ["compilation", "splitting_ops"], []),
        ("model.enforce_eager=true", ["model", "enforce_eager"], True),
        ("cache.sliding_window=null", ["cache", "sliding_window"], None),
        ("cache.cache_dtype=fp8=x", ["cache", "cache_dtype"], "fp8=x"),
        ("cache.cache_dtype=", ["cache", "cache_dtype"], ""),
        (
            "compilation.pass_config.enable_fusion=true",
            ["compilation", "pass_config", "enable_fusion"],
            True,
        ),
    ],
)
def test_parse_set_option(text: str, path: list[str], value: object) -> None:
    assert parse_set_option(text) == (path, value)


def test_nested_set_reaches_sub_sections(cli) -> None:
    result = cli(
        "resolve",
        "--simulate",
        "h100",
        "--json",
        "--set",
        "compilation.pass_config.enable_noop=true",
    )
    assert result.returncode == 0, result.stderr
    assert result.json()["config"]["compilation"]["pass_config"]["enable_noop"] is True


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    section=st.sampled_from(["model", "cache", "compilation", "parallel", "scheduler", "x", ""]),
    field=st.sampled_from(["block_size", "dtype", "level", "max_num_seqs", "nope", ""]),
    value=st.one_of(
        st.text(max_size=12),
        st.integers(-(10**6), 10**6).map(str),
        st.sampled_from(["[]", "{}", "null", "true", "[1,2]", '"x"', "1e309", "NaN"]),
    ),
    sep=st.sampled_from(["=", ":", ""]),
)
def test_any_set_text_is_accepted_or_one_clean_error(cli, section, field, value, sep) -> None:
    text = f"{section}.{field}{sep}{value}"
    try:
        parse_set_option(text)
        message = ""
    except CliError as exc:
        message = str(exc)
    assert not message or message.startswith(f"--set {text!r}: ")
    result = cli("resolve", "--simulate", "h100", "--json", "--set", text)
    assert result.returncode in (0, 2)
    if result.returncode == 2:
        assert_user_error(result)


def test_near_misses_get_a_suggestion_and_environment_errors_name_the_variable() -> None:
    from tests.cli.conftest import assert_user_error, run_hwplug

    assert_user_error(run_hwplug("resolve", "--simulate", "h1000"), "(did you mean 'h100'?)")
    assert_user_error(
        run_hwplug("info", env={"HWPLUG_SIMULATE": "h1000"}),
        "HWPLUG_SIMULATE=h1000: unknown device profile 'h1000' (did you mean 'h100'?)",
    )
    assert_user_error(
        run_hwplug("info", env={"HWPLUG_PLATFORM": "cudaa"}),
        "HWPLUG_PLATFORM=cudaa: unknown platform 'cudaa' (did you mean 'cuda'?)",
    )
