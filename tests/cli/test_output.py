"""Readable output at any width, and warnings in the JSON."""

from __future__ import annotations

import json

import pytest

from tests.cli.conftest import run_hwplug


@pytest.mark.parametrize("columns", ["80", "100"])
def test_resolve_tables_fit_the_width_and_cut_nothing(columns: str) -> None:
    result = run_hwplug("resolve", "--simulate", "h100", env={"COLUMNS": columns})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= int(columns)
    assert "…" not in result.stdout
    # every changed field path is printed whole, on one line
    for path in (
        "compilation.cudagraph_capture_sizes",
        "compilation.cudagraph_num_of_warmups",
        "compilation.cudagraph_mode",
        "scheduler.enable_chunked_prefill",
    ):
        assert any(path in line for line in lines), path
    assert "FULL_AND_PIECEWISE" in result.stdout


def test_piped_output_follows_columns() -> None:
    wide = run_hwplug("profiles", env={"COLUMNS": "200"})
    narrow = run_hwplug("profiles", env={"COLUMNS": "90"})
    assert max(map(len, narrow.stdout.splitlines())) <= 90
    assert max(map(len, wide.stdout.splitlines())) > 90


def test_resolve_json_carries_the_warnings() -> None:
    result = run_hwplug(
        "resolve", "--simulate", "h100", "--set", "compilation.use_cudagraph=false", "--json"
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert any("use_cudagraph is deprecated" in w for w in data["warnings"])
    clean = json.loads(run_hwplug("resolve", "--simulate", "h100", "--json").stdout)
    assert clean["warnings"] == []


@pytest.mark.parametrize("columns", ["80", "100", "120", "200"])
def test_no_column_is_cut_off_at_any_width(columns: str) -> None:
    """Every source and every reason of the change log is printed in full (wrapped, or
    as blocks on a narrow terminal), never cropped at the edge."""
    data = json.loads(run_hwplug("resolve", "--simulate", "mi300x", "--json").stdout)
    result = run_hwplug("resolve", "--simulate", "mi300x", env={"COLUMNS": columns})
    assert result.returncode == 0, result.stderr
    assert max(len(line) for line in result.stdout.splitlines()) <= int(columns)
    flat = " ".join(
        " ".join(line.replace("│", " ").replace("┃", " ").split())
        for line in result.stdout.splitlines()
    )
    words = flat.split()
    for change in data["changes"]:
        assert change["source"] in words, change["source"]
        for word in change["reason"].split():
            assert word in flat, (word, change["reason"])


def test_matrix_headers_are_never_broken_inside_a_word() -> None:
    result = run_hwplug("matrix", env={"COLUMNS": "80"})
    assert result.returncode == 0, result.stderr
    assert max(len(line) for line in result.stdout.splitlines()) <= 80
    for header in ("profile", "device", "memory", "KV-cache", "attention"):
        assert header in result.stdout, header
