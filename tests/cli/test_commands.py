"""Every ``hwplug`` command, through a real process and in-process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hwplug import __version__
from tests.cli.conftest import clean_env, run_hwplug

BUILTINS = {"cuda", "rocm", "cpu", "hpu", "xpu"}


# --------------------------------------------------------------------------- basics


def test_version_and_help_exit_zero(cli) -> None:
    result = run_hwplug("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"hwplug {__version__}"
    assert result.stderr == ""
    result = cli("--help")
    assert result.returncode == 0
    for command in ("info", "plugins", "profiles", "resolve", "matrix"):
        assert command in result.stdout


def test_help_lists_each_command_with_its_whole_summary() -> None:
    # summaries were cut at about 45 characters ("... and how it")
    result = run_hwplug("--help", env={"COLUMNS": "80"})
    assert result.returncode == 0
    commands = result.stdout.partition("Commands:")[2]
    assert commands and "..." not in commands
    text = " ".join(commands.split())
    assert "its devices, and how it was chosen." in text
    assert (
        "Check that a platform keeps hwplug's contract; exit status 1 when a check fails." in text
    )


@pytest.mark.parametrize("command", ["", "info", "resolve", "matrix", "conformance"])
def test_help_of_every_command_imports_no_torch_config_models_or_matrix(command: str) -> None:
    # `hwplug --help` must answer at once: none of the heavy modules is needed to print it
    heavy = ("torch", "hwplug.core.config.compilation", "hwplug.matrix", "hypothesis")
    code = (
        "import sys\n"
        "from hwplug.cli import main\n"
        f"status = main([*{command.split()!r}, '--help'])\n"
        f"print(status, [m for m in {heavy!r} if m in sys.modules], file=sys.stderr)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "Usage: hwplug" in result.stdout
    assert result.stderr.strip() == "0 []"


@pytest.mark.parametrize("args", [["matrix"], ["info"], ["matrix", "--format", "json"]])
def test_a_closed_output_pipe_ends_quietly_with_status_141(args: list[str]) -> None:
    # `hwplug matrix | head` exited 1
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first line is written
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "hwplug", *args],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            env=clean_env(),
            timeout=120,
            check=False,
        )
    finally:
        os.close(write_end)
    assert (proc.returncode, proc.stderr) == (141, "")


def test_no_arguments_prints_help(cli) -> None:
    result = cli()
    assert result.returncode == 0
    assert "Usage: hwplug" in result.stdout
    assert "resolve" in result.stdout


@pytest.mark.skipif(
    shutil.which("hwplug", path=str(Path(sys.executable).parent)) is None,
    reason="the hwplug console script is not installed in this environment",
)
def test_console_script_runs_the_same_command() -> None:
    import subprocess

    from tests.cli.conftest import clean_env

    script = shutil.which("hwplug", path=str(Path(sys.executable).parent))
    assert script is not None
    proc = subprocess.run(
        [script, "resolve", "--simulate", "l4", "--json"],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["platform"] == "cuda"


# --------------------------------------------------------------------------- info


def test_info_json_has_the_contract_keys_for_detected_hardware() -> None:
    result = run_hwplug("info", "--json")
    assert result.returncode == 0, result.stderr
    data = result.json()
    assert {"platform", "simulated", "devices", "candidates", "plugins"} <= set(data)
    assert data["simulated"] is False
    assert data["reason"]
    names = {c["name"] for c in data["candidates"]}
    assert names >= BUILTINS
    chosen = next(c for c in data["candidates"] if c["name"] == data["platform"])
    assert chosen["present"] is True
    assert chosen["probed"] is True
    # The CPU is always present, so it is a candidate with a device even when it loses.
    cpu = next(c for c in data["candidates"] if c["name"] == "cpu")
    assert cpu["present"] is True
    assert cpu["devices"]
    plugins = {p["name"]: p for p in data["plugins"]}
    assert set(plugins) >= BUILTINS
    assert all(plugins[name]["distribution"] == "hwplug" for name in BUILTINS)


def test_info_json_under_simulation_reports_the_profile() -> None:
    result = run_hwplug("info", "--json", env={"HWPLUG_SIMULATE": "mi300x:8"})
    assert result.returncode == 0, result.stderr
    data = result.json()
    assert data["platform"] == "rocm"
    assert data["simulated"] is True
    assert data["profile"] == "mi300x:8"
    assert len(data["devices"]) == 8
    assert data["devices"][0]["arch"] == "gfx942"
    assert "HWPLUG_SIMULATE=mi300x:8" in data["reason"]
    assert all(c["probed"] is False for c in data["candidates"])


def test_info_tables_show_platform_candidates_and_plugins(cli, monkeypatch) -> None:
    monkeypatch.setenv("HWPLUG_SIMULATE", "h100:2")
    result = cli("info")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "Platform: cuda (simulated profile h100:2)" in out
    assert "NVIDIA H100 80GB HBM3" in out
    assert "Candidate platforms" in out
    assert "chosen" in out
    assert "Plugins" in out
    assert "hwplug.platforms.cuda" in out
    assert result.stderr == ""


# --------------------------------------------------------------------------- plugins, profiles


def test_plugins_json_lists_builtins_with_their_platforms() -> None:
    result = run_hwplug("plugins", "--json")
    assert result.returncode == 0, result.stderr
    data = result.json()
    plugins = {p["name"]: p for p in data["plugins"]}
    assert set(plugins) >= BUILTINS
    assert plugins["cuda"]["platforms"] == ["cuda"]
    assert plugins["rocm"]["builtin"] is True
    assert plugins["cpu"]["group"] == "hwplug.platforms"
    assert data["failures"] == []


def test_plugins_table(cli) -> None:
    result = cli("plugins")
    assert result.returncode == 0
    assert "hwplug.platforms.rocm" in result.stdout


def test_profiles_json_and_table_cover_every_contract_profile(cli) -> None:
    result = run_hwplug("profiles", "--json")
    assert result.returncode == 0, result.stderr
    profiles = {p["name"]: p for p in result.json()}
    for name in (
        "h100",
        "a100",
        "l4",
        "mi300x",
        "mi355x",
        "gaudi2",
        "gaudi3",
        "xeon-spr",
        "cpu-generic",
        "max-1550",
        "arc-a770",
    ):
        assert name in profiles
    assert profiles["h100"]["platform"] == "cuda"
    assert profiles["h100"]["representative"] is True
    assert profiles["h100"]["device"]["capability"] == "9.0"
    assert profiles["mi355x"]["device"]["arch"] == "gfx950"
    table = cli("profiles")
    assert table.returncode == 0
    assert "h100 *" in table.stdout
    assert "mi300x" in table.stdout


# --------------------------------------------------------------------------- resolve


def test_resolve_json_has_config_sections_and_attributed_changes() -> None:
    result = run_hwplug("resolve", "--simulate", "h100", "--json")
    assert result.returncode == 0, result.stderr
    data = result.json()
    assert {"platform", "config", "changes"} <= set(data)
    assert data["platform"] == "cuda"
    assert set(data["config"]) == {
        "model",
        "cache",
        "compilation",
        "parallel",
        "scheduler",
        "attention",
    }
    assert data["config"]["cache"]["block_size"] == 16
    assert data["config"]["compilation"]["cudagraph_mode"] == "FULL_AND_PIECEWISE"
    for change in data["changes"]:
        assert set(change) == {"path", "old", "new", "source", "reason"}
    by_path = {c["path"]: c for c in data["changes"]}
    assert by_path["compilation.level"]["new"] == 3
    assert by_path["compilation.level"]["source"] == "engine"
    assert by_path["cache.block_size"]["source"] == "platform:cuda"
    assert by_path["cache.block_size"]["old"] is None


def test_resolve_set_values_are_parsed_as_json_where_they_parse(cli) -> None:
    result = cli(
        "resolve",
        "--simulate",
        "h100",
        "--json",
        "--set",
        "cache.block_size=32",
        "--set",
        "compilation.cudagraph_mode=FULL",
        "--set",
        "compilation.splitting_ops=[]",
        "--set",
        "model.enforce_eager=false",
    )
    assert result.returncode == 0, result.stderr
    config = result.json()["config"]
    assert config["cache"]["block_size"] == 32
    assert config["compilation"]["cudagraph_mode"] == "FULL"
    assert config["compilation"]["splitting_ops"] == []
    # Values the user set are honoured, never reported as changes.
    paths = {c["path"] for c in result.json()["changes"]}
    assert "cache.block_size" not in paths


def test_resolve_set_is_applied_on_top_of_a_config_file(cli, tmp_path: Path) -> None:
    path = tmp_path / "engine.yaml"
    path.write_text("cache:\n  block_size: 8\n  cache_dtype: fp8\nscheduler:\n  max_num_seqs: 64\n")
    result = cli(
        "resolve",
        "--simulate",
        "l4",
        "--config",
        str(path),
        "--set",
        "cache.block_size=32",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    config = result.json()["config"]
    assert config["cache"]["block_size"] == 32  # --set wins over the file
    assert config["cache"]["cache_dtype"] == "fp8"  # the rest of the file stays
    assert config["scheduler"]["max_num_seqs"] == 64


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("engine.json", '{"model": {"enforce_eager": true}}'),
        ("engine.toml", "[model]\nenforce_eager = true\n"),
        ("engine.yml", "model:\n  enforce_eager: true\n"),
    ],
)
def test_resolve_reads_json_toml_and_yaml_files(cli, tmp_path: Path, name: str, text: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    result = cli("resolve", "--simulate", "a100", "--config", str(path), "--json")
    assert result.returncode == 0, result.stderr
    config = result.json()["config"]
    assert config["model"]["enforce_eager"] is True
    assert config["compilation"]["level"] == 0
    assert config["compilation"]["cudagraph_mode"] == "NONE"


def test_resolve_with_platform_name_uses_the_representative_profile_when_absent(cli) -> None:
    result = cli("resolve", "--platform", "hpu", "--json")
    assert result.returncode == 0, result.stderr
    data = result.json()
    assert data["platform"] == "hpu"
    assert data["simulated"] is True
    assert data["config"]["cache"]["block_size"] == 128


def test_resolve_defaults_to_the_current_platform(cli, monkeypatch) -> None:
    monkeypatch.setenv("HWPLUG_SIMULATE", "gaudi3")
    result = cli("resolve", "--json")
    assert result.returncode == 0, result.stderr
    assert result.json()["platform"] == "hpu"


def test_resolve_tables_show_config_and_changes(cli) -> None:
    result = cli("resolve", "--simulate", "xeon-spr")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "Resolved for cpu (simulated profile xeon-spr)" in out
    assert "cache.block_size *" in out  # changed by resolution
    assert "Changes (" in out
    assert "platform:cpu" in out
    assert "KV-cache space: default 4 GiB" in out


def test_resolve_shortens_long_lists_for_people_only(cli) -> None:
    table = cli("resolve", "--simulate", "h100")
    assert "(67 items)" in table.stdout
    data = cli("resolve", "--simulate", "h100", "--json").json()
    assert len(data["config"]["compilation"]["cudagraph_capture_sizes"]) == 67


def test_deprecation_warnings_are_one_line_each_after_success(cli) -> None:
    result = cli("resolve", "--simulate", "h100", "--set", "compilation.use_cudagraph=false")
    assert result.returncode == 0
    warning_lines = [line for line in result.stderr.splitlines() if line]
    assert warning_lines
    assert all(line.startswith("hwplug: warning: ") for line in warning_lines)
    assert any("use_cudagraph is deprecated" in line for line in warning_lines)


def test_square_brackets_in_values_are_printed_verbatim(cli) -> None:
    result = cli("resolve", "--simulate", "h100", "--set", 'compilation.custom_ops=["+rms_norm"]')
    assert result.returncode == 0, result.stderr
    assert '["+rms_norm"]' in result.stdout


# --------------------------------------------------------------------------- matrix


def test_matrix_json_has_a_row_per_profile() -> None:
    result = run_hwplug("matrix", "--format", "json")
    assert result.returncode == 0, result.stderr
    rows = {row["profile"]: row for row in result.json()}
    assert {"h100", "mi300x", "gaudi2", "xeon-spr", "max-1550"} <= set(rows)
    h100 = rows["h100"]
    assert h100["platform"] == "cuda"
    assert h100["default_block_size"] == 16
    assert h100["block_sizes"] == [8, 16, 32]
    assert h100["mla_default_block_size"] == 64
    assert h100["fp8_format"] == "float8_e4m3fn"
    assert h100["dist_backend"] == "nccl"
    assert "FULL_AND_PIECEWISE" in h100["graph_modes"]
    assert h100["default_compilation_level"] == "PIECEWISE (3)"
    assert rows["mi300x"]["fp8_format"] == "float8_e4m3fnuz"
    assert rows["gaudi2"]["graph_modes"] == ["NONE", "FULL", "FULL_DECODE_ONLY"]
    assert "fp8_inc" in rows["gaudi2"]["cache_dtypes"]
    assert rows["xeon-spr"]["default_block_size"] == 128


def test_matrix_markdown_is_the_docs_page(cli, monkeypatch) -> None:
    from hwplug.matrix import support_matrix_page

    # Built-ins only, whatever vendor plugins are installed: the docs page.
    monkeypatch.setenv("HWPLUG_PLUGINS", "")
    result = cli("matrix", "--format", "markdown")
    assert result.returncode == 0
    assert result.stdout == support_matrix_page()
    assert result.stdout.startswith("# Support matrix")
    assert "| `h100` |" in result.stdout


def test_matrix_table_is_the_default_format(cli) -> None:
    result = cli("matrix")
    assert result.returncode == 0
    assert "cuda (hwplug): priority 10" in result.stdout
    assert "h100" in result.stdout
    assert "gaudi2" in result.stdout


def test_matrix_installed_shows_only_present_platforms(cli) -> None:
    result = run_hwplug("matrix", "--installed", "--format", "json")
    assert result.returncode == 0, result.stderr
    rows = result.json()
    assert rows
    assert all(row["profile"] is None for row in rows)
    assert "cpu" in {row["platform"] for row in rows}
    table = cli("matrix", "--installed")
    assert table.returncode == 0
    assert "detected" in table.stdout
    markdown = cli("matrix", "--installed", "--format", "markdown")
    assert markdown.stdout.startswith("# Support matrix (this machine)")
