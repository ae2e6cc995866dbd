"""Helpers to run the ``hwplug`` command in a subprocess and in-process."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from hwplug.plugins import manager

SRC = Path(__file__).resolve().parents[2] / "src"


@dataclasses.dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)

    @property
    def stderr_lines(self) -> list[str]:
        return self.stderr.splitlines()


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment without hwplug's variables, with src/ importable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HWPLUG_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), env.get("PYTHONPATH")]))
    env["COLUMNS"] = "200"
    env.update(extra or {})
    return env


def run_hwplug(*args: str, env: Mapping[str, str] | None = None, cwd: Path | None = None) -> Result:
    """``python -m hwplug ARGS`` in a fresh process."""
    proc = subprocess.run(
        [sys.executable, "-m", "hwplug", *args],
        capture_output=True,
        text=True,
        env=clean_env(env),
        cwd=cwd,
        timeout=120,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


def assert_user_error(result: Result, *fragments: str) -> str:
    """Exit status 2, exactly one ``hwplug: error:`` line on stderr, containing fragments."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr_lines
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert line.startswith("hwplug: error: "), line
    for fragment in fragments:
        assert fragment in line, (fragment, line)
    return line


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Run ``hwplug.cli.main`` in-process with a clean hwplug environment."""
    from hwplug.cli import main

    for key in list(os.environ):
        if key.startswith("HWPLUG_"):
            monkeypatch.delenv(key)
    manager.reset()

    def run(*args: str) -> Result:
        capsys.readouterr()
        code = main(list(args))
        out, err = capsys.readouterr()
        return Result(code, out, err)

    yield run
    manager.reset()
