"""``--set`` on top of ``--config`` gives what one source holding both would."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _resolve_cli(cli: Any, *args: str) -> dict[str, Any]:
    result = cli("resolve", "--simulate", "h100", "--json", *args)
    assert result.returncode == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def test_set_on_an_empty_config_file_is_the_same_as_set_alone(cli, tmp_path: Path) -> None:
    empty = tmp_path / "empty.json"
    empty.write_text("{}")
    alone = _resolve_cli(cli, "--set", "scheduler.max_num_seqs=8")
    with_file = _resolve_cli(cli, "--config", str(empty), "--set", "scheduler.max_num_seqs=8")
    sizes = alone["config"]["compilation"]["cudagraph_capture_sizes"]
    assert sizes == [16, 8, 4, 2, 1]
    assert with_file["config"] == alone["config"]
    assert with_file["changes"] == alone["changes"]


def test_set_overrides_a_deprecated_flag_given_in_the_file(cli, tmp_path: Path) -> None:
    file = tmp_path / "engine.yaml"
    file.write_text("compilation:\n  use_cudagraph: false\n")
    off = _resolve_cli(cli, "--config", str(file))
    assert off["config"]["compilation"]["cudagraph_mode"] == "NONE"
    on = _resolve_cli(cli, "--config", str(file), "--set", "compilation.use_cudagraph=true")
    assert on["config"]["compilation"]["cudagraph_mode"] == "FULL_AND_PIECEWISE"
